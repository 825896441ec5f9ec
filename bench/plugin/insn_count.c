/*
 * insn_count: a QEMU TCG plugin that counts the guest instructions executed
 * between two marks issued by the guest, split into scalar, vector
 * arithmetic, vector loads/stores and vset{i}vl{i}, with every vector
 * instruction also weighted by its register-group size (LMUL-1 equivalents),
 * and with the part executed inside one address range (the kernel library)
 * counted apart.
 *
 * Marks are lseek(2) calls on an impossible file descriptor (MARK_FD, which
 * is negative, so the kernel answers EBADF and nothing else happens); the
 * "whence" argument says which mark it is and the offset carries its value:
 *   MARK_RANGE_LO addr / MARK_RANGE_HI addr  the library's text range [lo, hi)
 *   MARK_START label / MARK_END label        open / close a measured region
 * At MARK_END the plugin appends one JSON line with the region's counts to
 * the file given as `outfile=` (or to QEMU's log). Counting is off outside a
 * region (the per-block check is one inline comparison), so a region's count
 * is exact and does not depend on what ran before it.
 *
 * Weighting (LMUL-1 equivalents): scalar instructions and vset* count 1; a
 * vector arithmetic instruction counts max(1, LMUL) of the vtype in force; a
 * unit-stride or strided load/store counts nf * max(1, EMUL) with
 * EMUL = EEW / SEW * LMUL, an indexed one nf * max(1, LMUL) (its data group), a
 * whole-register one its register count, a mask load/store 1. vtype is tracked
 * through vsetvli/vsetivli (immediate) and vsetvl (rs2, read at execution).
 *
 * Block profile (`blocks=<path>`): for the cycle model, every translation
 * block of the library that ran inside a region is also reported at
 * MARK_END, as one JSON line per region: its offset in the library, its
 * machine code, and how often it was entered other than by falling through
 * from the block before it, by the vtype in force at that entry (llvm-mca
 * needs the vtype of code that does not set its own). QEMU ends a block at
 * every vset*, so one basic block of the kernel is often several translation
 * blocks; the host joins a block with the ones it falls through to, up to
 * the next branch, and times the whole basic block.
 */
#include <glib.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

#define SYS_LSEEK_RISCV64 62
#define MARK_FD (-21078) /* -0x5256 */
enum { MARK_RANGE_LO = 0x5201, MARK_RANGE_HI, MARK_START, MARK_END };

enum insn_class { SCALAR, VECTOR_ARITH, VECTOR_MEM, VSET, N_CLASSES };
static const char *const class_names[N_CLASSES] = {"scalar", "vector_arith", "vector_mem", "vset"};

/* Counts of one region: raw per class, and LMUL-1 equivalents of vector arith / mem. */
typedef struct {
    uint64_t raw[N_CLASSES];
    uint64_t weighted_arith;
    uint64_t weighted_mem;
} Counts;

typedef struct {
    uint64_t active; /* 1 inside a region: the condition of every counting callback */
    uint64_t unknown_vtype; /* vector instructions executed before any vset* was seen */
    const void *last_lib_block; /* the library block that ran last, if the one before this was one */
    uint32_t lmul8; /* LMUL * 8 (1 = mf8 ... 64 = m8); 0 while unknown */
    uint32_t sew; /* bits */
    Counts all;
    Counts lib;
} Vcpu;

/* The vtypes a block can be entered with: SEW 8..64 x LMUL mf8..m8, and one slot for "not known yet". */
enum { N_LMULS = 7, N_SEWS = 4, VTYPE_UNKNOWN = N_SEWS * N_LMULS, N_VTYPE_SLOTS };

/* What a translation block contributes each time it runs. */
typedef struct {
    uint64_t vaddr;
    uint32_t n[N_CLASSES];
    uint32_t size; /* bytes of code (block profile only) */
    uint8_t *code; /* its machine code (block profile only) */
    int falls_through; /* its last instruction is not a jump, branch or ecall */
    uint64_t *runs; /* entries per entry vtype slot; allocated when it first runs in the library in a region */
} Block;

/* One vector instruction, decoded once at translation. */
typedef struct {
    uint64_t vaddr;
    uint8_t is_mem;
    uint8_t mem_kind; /* MEM_* below */
    uint8_t nf; /* fields (segments) or whole registers */
    uint16_t eew; /* element width of the memory operand, bits */
} VecInsn;
enum { MEM_UNIT, MEM_STRIDED, MEM_INDEXED, MEM_WHOLE, MEM_MASK };

/* vsetvl's vtype comes from a register, read when it executes. */
typedef struct {
    unsigned rs2;
} VsetReg;

static struct qemu_plugin_scoreboard *vcpus;
static qemu_plugin_u64 active_entry;
static GMutex lock;
static uint64_t lib_lo, lib_hi;
static uint64_t region_label;
static int region_open;
static FILE *out;
static FILE *blocks_out; /* the block profile's file, when asked for */
static GPtrArray *profiled; /* the blocks that have run counters, reported and reset at each MARK_END */
static struct qemu_plugin_register *xreg[32];
static const char *const xreg_names[32] = {
    "zero", "ra", "sp", "gp", "tp", "t0", "t1", "t2", "fp", "s1", "a0",  "a1",  "a2", "a3", "a4", "a5",
    "a6",   "a7", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11", "t3", "t4", "t5", "t6",
};

static Vcpu *vcpu(unsigned int index) { return qemu_plugin_scoreboard_find(vcpus, index); }
static int in_lib(uint64_t vaddr) { return vaddr >= lib_lo && vaddr < lib_hi; }

static void emit(const char *line)
{
    if (out) {
        fputs(line, out);
        fflush(out);
    } else {
        qemu_plugin_outs(line);
    }
}

/* ---- decoding ------------------------------------------------------------------------------- */

static uint32_t insn_word(const struct qemu_plugin_insn *insn)
{
    uint32_t word = 0;
    size_t size = qemu_plugin_insn_size(insn);
    qemu_plugin_insn_data(insn, &word, size < sizeof word ? size : sizeof word);
    return word; /* riscv is little-endian, as is every host QEMU builds this for */
}

static uint16_t mem_eew(uint32_t width)
{
    switch (width) {
    case 0: return 8;
    case 5: return 16;
    case 6: return 32;
    case 7: return 64;
    default: return 0; /* a scalar FP load/store (flh/flw/fld/flq) */
    }
}

static enum insn_class classify(uint32_t word, size_t size, VecInsn *vec)
{
    if (size != 4 || (word & 3) != 3) {
        return SCALAR; /* compressed instructions are all scalar */
    }
    uint32_t opcode = word & 0x7f, funct3 = (word >> 12) & 7;
    memset(vec, 0, sizeof *vec);
    if (opcode == 0x57) {
        return funct3 == 7 ? VSET : VECTOR_ARITH;
    }
    if (opcode == 0x07 || opcode == 0x27) { /* LOAD-FP / STORE-FP: vector when the width is 0, 5, 6, 7 */
        uint16_t eew = mem_eew(funct3);
        if (!eew) {
            return SCALAR;
        }
        uint32_t mop = (word >> 26) & 3, umop = (word >> 20) & 0x1f;
        vec->is_mem = 1;
        vec->eew = eew;
        vec->nf = (uint8_t)(((word >> 29) & 7) + 1);
        if (mop == 0) {
            vec->mem_kind = umop == 0x08 ? MEM_WHOLE : umop == 0x0b ? MEM_MASK : MEM_UNIT;
        } else {
            vec->mem_kind = mop == 2 ? MEM_STRIDED : MEM_INDEXED;
        }
        return VECTOR_MEM;
    }
    return SCALAR;
}

/* Whether an instruction may go anywhere but the next one: a jump, a branch, or a system call. */
static int transfers_control(uint32_t word, size_t size)
{
    if (size == 2) {
        uint32_t quadrant = word & 3, funct3 = (word >> 13) & 7;
        if (quadrant == 1) {
            return funct3 == 5 || funct3 == 6 || funct3 == 7; /* c.j, c.beqz, c.bnez */
        }
        /* c.jr, c.jalr, c.ebreak: funct3 100 with rs2 = 0 and rs1 != 0 (or rs1 = 0, bit 12 set: c.ebreak) */
        return quadrant == 2 && funct3 == 4 && ((word >> 2) & 0x1f) == 0 && (((word >> 7) & 0x1f) || (word >> 12 & 1));
    }
    uint32_t opcode = word & 0x7f;
    return opcode == 0x63 || opcode == 0x6f || opcode == 0x67 || opcode == 0x73;
}

static void set_vtype(Vcpu *v, uint64_t vtype)
{
    static const uint32_t lmul8_of[8] = {8, 16, 32, 64, 0, 1, 2, 4};
    v->lmul8 = lmul8_of[vtype & 7];
    v->sew = 8u << ((vtype >> 3) & 7);
}

static uint64_t group(uint64_t eighths) { return eighths <= 8 ? 1 : eighths / 8; }

static uint64_t weight(const Vcpu *v, const VecInsn *insn)
{
    uint32_t lmul8 = v->lmul8 ? v->lmul8 : 8;
    if (!insn->is_mem) {
        return group(lmul8);
    }
    switch (insn->mem_kind) {
    case MEM_WHOLE: return insn->nf;
    case MEM_MASK: return 1;
    case MEM_INDEXED: return insn->nf * group(lmul8);
    default: {
        uint32_t sew = v->sew ? v->sew : insn->eew;
        return insn->nf * group((uint64_t)lmul8 * insn->eew / sew);
    }
    }
}

/* ---- execution callbacks ---------------------------------------------------------------------- */

static void add_block(Counts *c, const Block *b)
{
    for (int k = 0; k < N_CLASSES; k++) {
        c->raw[k] += b->n[k];
    }
}

static int vtype_slot(const Vcpu *v)
{
    if (v->lmul8 == 0) {
        return VTYPE_UNKNOWN;
    }
    int lmul = __builtin_ctz(v->lmul8); /* 1 (mf8) .. 64 (m8) -> 0 .. 6 */
    int sew = __builtin_ctz(v->sew) - 3; /* 8 .. 64 bits -> 0 .. 3 */
    return sew * N_LMULS + lmul;
}

static void profile_run(Block *b, Vcpu *v)
{
    if (!b->runs) {
        g_mutex_lock(&lock);
        if (!b->runs) {
            b->runs = g_new0(uint64_t, N_VTYPE_SLOTS + 1); /* the last one: runs however entered */
            g_ptr_array_add(profiled, b);
        }
        g_mutex_unlock(&lock);
    }
    const Block *before = v->last_lib_block;
    int fell_through = before && before->falls_through && before->vaddr + before->size == b->vaddr;
    if (!fell_through) {
        __atomic_fetch_add(&b->runs[vtype_slot(v)], 1, __ATOMIC_RELAXED);
    }
    __atomic_fetch_add(&b->runs[N_VTYPE_SLOTS], 1, __ATOMIC_RELAXED);
    v->last_lib_block = b;
}

static void on_block(unsigned int vcpu_index, void *udata)
{
    Block *b = udata;
    Vcpu *v = vcpu(vcpu_index);
    add_block(&v->all, b);
    if (in_lib(b->vaddr)) {
        add_block(&v->lib, b);
        if (blocks_out) {
            profile_run(b, v); /* before this block's own vset*: the vtype it was entered with */
        }
    } else {
        v->last_lib_block = NULL;
    }
}

static void on_vector(unsigned int vcpu_index, void *udata)
{
    const VecInsn *insn = udata;
    Vcpu *v = vcpu(vcpu_index);
    uint64_t w = weight(v, insn);
    v->unknown_vtype += v->lmul8 == 0;
    uint64_t *all = insn->is_mem ? &v->all.weighted_mem : &v->all.weighted_arith;
    *all += w;
    if (in_lib(insn->vaddr)) {
        *(insn->is_mem ? &v->lib.weighted_mem : &v->lib.weighted_arith) += w;
    }
}

static void on_vset_imm(unsigned int vcpu_index, void *udata)
{
    set_vtype(vcpu(vcpu_index), (uint64_t)(uintptr_t)udata);
}

static void on_vset_reg(unsigned int vcpu_index, void *udata)
{
    const VsetReg *r = udata;
    Vcpu *v = vcpu(vcpu_index);
    if (r->rs2 == 0) {
        set_vtype(v, 0);
        return;
    }
    GByteArray *buf = g_byte_array_new();
    uint64_t value = 0;
    if (xreg[r->rs2] && qemu_plugin_read_register(xreg[r->rs2], buf) >= 8) {
        memcpy(&value, buf->data, 8);
        set_vtype(v, value);
    } else {
        v->lmul8 = 0; /* unknown: counted in unknown_vtype until the next vset */
    }
    g_byte_array_free(buf, TRUE);
}

/* ---- translation ------------------------------------------------------------------------------ */

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    Block *block = g_new0(Block, 1);
    block->vaddr = qemu_plugin_tb_vaddr(tb);
    if (blocks_out) {
        for (size_t i = 0; i < n; i++) {
            block->size += qemu_plugin_insn_size(qemu_plugin_tb_get_insn(tb, i));
        }
        block->code = g_malloc(block->size);
        for (size_t i = 0, at = 0; i < n; i++) {
            struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
            at += qemu_plugin_insn_data(insn, block->code + at, block->size - at);
        }
        struct qemu_plugin_insn *last = qemu_plugin_tb_get_insn(tb, n - 1);
        block->falls_through = !transfers_control(insn_word(last), qemu_plugin_insn_size(last));
    }
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        uint32_t word = insn_word(insn);
        VecInsn decoded;
        enum insn_class cls = classify(word, qemu_plugin_insn_size(insn), &decoded);
        block->n[cls]++;
        if (cls == VECTOR_ARITH || cls == VECTOR_MEM) {
            VecInsn *vec = g_memdup2(&decoded, sizeof decoded);
            vec->vaddr = qemu_plugin_insn_vaddr(insn);
            qemu_plugin_register_vcpu_insn_exec_cond_cb(insn, on_vector, QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_COND_NE,
                                                        active_entry, 0, vec);
        } else if (cls == VSET) {
            /* Tracked always (vset* are rare outside kernels), so vtype is right when a region opens. */
            if ((word >> 31) == 0 || (word >> 30) == 3) { /* vsetvli / vsetivli: vtype is an immediate */
                uint64_t vtype = (word >> 31) == 0 ? (word >> 20) & 0x7ff : (word >> 20) & 0x3ff;
                qemu_plugin_register_vcpu_insn_exec_cb(insn, on_vset_imm, QEMU_PLUGIN_CB_NO_REGS,
                                                       (void *)(uintptr_t)vtype);
            } else { /* vsetvl: vtype in rs2 */
                VsetReg *r = g_new0(VsetReg, 1);
                r->rs2 = (word >> 20) & 0x1f;
                qemu_plugin_register_vcpu_insn_exec_cb(insn, on_vset_reg, QEMU_PLUGIN_CB_R_REGS, r);
            }
        }
    }
    qemu_plugin_register_vcpu_tb_exec_cond_cb(tb, on_block, QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_COND_NE, active_entry,
                                              0, block);
}

/* ---- marks ------------------------------------------------------------------------------------ */

static void append_counts(GString *s, const char *name, const Counts *c)
{
    g_string_append_printf(s, "\"%s\": {", name);
    for (int k = 0; k < N_CLASSES; k++) {
        g_string_append_printf(s, "\"%s\": %" PRIu64 ", ", class_names[k], c->raw[k]);
    }
    g_string_append_printf(s, "\"vector_arith_lmul1\": %" PRIu64 ", \"vector_mem_lmul1\": %" PRIu64 "}",
                           c->weighted_arith, c->weighted_mem);
}

static void sum_counts(Counts *into, const Counts *c)
{
    for (int k = 0; k < N_CLASSES; k++) {
        into->raw[k] += c->raw[k];
    }
    into->weighted_arith += c->weighted_arith;
    into->weighted_mem += c->weighted_mem;
}

/* The region's block profile as one JSON line; the counters start again from zero. */
static void emit_profile(uint64_t label)
{
    static const uint32_t sews[N_SEWS] = {8, 16, 32, 64};
    GString *s = g_string_new(NULL);
    g_string_append_printf(s, "{\"label\": %" PRIu64 ", \"blocks\": [", label);
    int first_block = 1;
    for (guint i = 0; i < profiled->len; i++) {
        Block *b = g_ptr_array_index(profiled, i);
        if (!b->runs[N_VTYPE_SLOTS]) {
            continue; /* ran in an earlier region only */
        }
        g_string_append_printf(s, "%s{\"offset\": %" PRIu64 ", \"code\": \"", first_block ? "" : ", ",
                               b->vaddr - lib_lo);
        first_block = 0;
        for (uint32_t k = 0; k < b->size; k++) {
            g_string_append_printf(s, "%02x", b->code[k]);
        }
        g_string_append(s, "\", \"entries\": [");
        int first = 1;
        for (int slot = 0; slot < N_VTYPE_SLOTS; slot++) {
            if (!b->runs[slot]) {
                continue;
            }
            if (slot == VTYPE_UNKNOWN) {
                g_string_append_printf(s, "%s[null, ", first ? "" : ", ");
            } else {
                g_string_append_printf(s, "%s[[%u, %u], ", first ? "" : ", ", sews[slot / N_LMULS],
                                       1u << (slot % N_LMULS));
            }
            g_string_append_printf(s, "%" PRIu64 "]", b->runs[slot]);
            first = 0;
        }
        g_string_append_printf(s, "], \"runs\": %" PRIu64 "}", b->runs[N_VTYPE_SLOTS]);
        memset(b->runs, 0, (N_VTYPE_SLOTS + 1) * sizeof *b->runs); /* the next region starts from zero */
    }
    g_string_append(s, "]}\n");
    fputs(s->str, blocks_out);
    fflush(blocks_out);
    g_string_free(s, TRUE);
}

static void mark_error(const char *what, uint64_t value)
{
    g_autofree char *line = g_strdup_printf("{\"error\": \"%s\", \"value\": %" PRIu64 "}\n", what, value);
    emit(line);
}

static void open_region(uint64_t label)
{
    if (region_open) {
        mark_error("start mark inside an open region", label);
        return;
    }
    if (lib_hi <= lib_lo) {
        mark_error("start mark before the library range was given", label);
    }
    int n = qemu_plugin_num_vcpus();
    for (int i = 0; i < n; i++) {
        Vcpu *v = vcpu(i);
        memset(&v->all, 0, sizeof v->all);
        memset(&v->lib, 0, sizeof v->lib);
        v->unknown_vtype = 0;
        v->last_lib_block = NULL;
        v->active = 1;
    }
    region_label = label;
    region_open = 1;
}

static void close_region(uint64_t label)
{
    if (!region_open || label != region_label) {
        mark_error("end mark without a matching start mark", label);
        return;
    }
    Counts all = {0}, lib = {0};
    uint64_t unknown = 0;
    int n = qemu_plugin_num_vcpus();
    for (int i = 0; i < n; i++) {
        Vcpu *v = vcpu(i);
        v->active = 0;
        sum_counts(&all, &v->all);
        sum_counts(&lib, &v->lib);
        unknown += v->unknown_vtype;
    }
    region_open = 0;
    GString *s = g_string_new(NULL);
    g_string_append_printf(s, "{\"label\": %" PRIu64 ", \"vcpus\": %d, \"unknown_vtype\": %" PRIu64 ", ", label, n,
                           unknown);
    append_counts(s, "all", &all);
    g_string_append(s, ", ");
    append_counts(s, "lib", &lib);
    g_string_append(s, "}\n");
    emit(s->str);
    g_string_free(s, TRUE);
    if (blocks_out) {
        emit_profile(label);
    }
}

static void on_syscall(qemu_plugin_id_t id, unsigned int vcpu_index, int64_t num, uint64_t a1, uint64_t a2, uint64_t a3,
                       uint64_t a4, uint64_t a5, uint64_t a6, uint64_t a7, uint64_t a8)
{
    (void)id, (void)vcpu_index, (void)a4, (void)a5, (void)a6, (void)a7, (void)a8;
    if (num != SYS_LSEEK_RISCV64 || (int32_t)a1 != MARK_FD) {
        return;
    }
    g_mutex_lock(&lock);
    switch ((int32_t)a3) {
    case MARK_RANGE_LO: lib_lo = a2; break;
    case MARK_RANGE_HI: lib_hi = a2; break;
    case MARK_START: open_region(a2); break;
    case MARK_END: close_region(a2); break;
    default: mark_error("unknown mark", (uint64_t)(int64_t)(int32_t)a3);
    }
    g_mutex_unlock(&lock);
}

static void on_vcpu_init(qemu_plugin_id_t id, unsigned int vcpu_index)
{
    (void)id;
    g_mutex_lock(&lock);
    vcpu(vcpu_index)->active = region_open;
    if (!xreg[1]) {
        GArray *regs = qemu_plugin_get_registers();
        for (guint i = 0; i < regs->len; i++) {
            qemu_plugin_reg_descriptor *d = &g_array_index(regs, qemu_plugin_reg_descriptor, i);
            for (int x = 1; x < 32; x++) {
                if (!strcmp(d->name, xreg_names[x]) || (x == 8 && !strcmp(d->name, "s0"))) {
                    xreg[x] = d->handle;
                }
            }
        }
        g_array_free(regs, TRUE);
    }
    g_mutex_unlock(&lock);
}

static void on_exit(qemu_plugin_id_t id, void *udata)
{
    (void)id, (void)udata;
    if (region_open) {
        mark_error("the program exited inside a region", region_label);
    }
    if (out) {
        fclose(out);
        out = NULL;
    }
    if (blocks_out) {
        fclose(blocks_out);
        blocks_out = NULL;
    }
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv)
{
    (void)info;
    for (int i = 0; i < argc; i++) {
        if (g_str_has_prefix(argv[i], "outfile=")) {
            out = fopen(argv[i] + strlen("outfile="), "a");
            if (!out) {
                fprintf(stderr, "insn_count: cannot open %s for appending\n", argv[i] + strlen("outfile="));
                return -1;
            }
        } else if (g_str_has_prefix(argv[i], "blocks=")) {
            blocks_out = fopen(argv[i] + strlen("blocks="), "a");
            if (!blocks_out) {
                fprintf(stderr, "insn_count: cannot open %s for appending\n", argv[i] + strlen("blocks="));
                return -1;
            }
        } else {
            fprintf(stderr, "insn_count: unknown argument %s (known: outfile=<path>, blocks=<path>)\n", argv[i]);
            return -1;
        }
    }
    profiled = g_ptr_array_new();
    vcpus = qemu_plugin_scoreboard_new(sizeof(Vcpu));
    active_entry = qemu_plugin_scoreboard_u64_in_struct(vcpus, Vcpu, active);
    qemu_plugin_register_vcpu_init_cb(id, on_vcpu_init);
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
    qemu_plugin_register_atexit_cb(id, on_exit, NULL);
    return 0;
}
