// SPDX-License-Identifier: Apache-2.0
/*
 * A qemu TCG plugin (a bench tool, built by insn_per_token.sh, never
 * shipped): counts the guest instructions a qemu-user process executes and
 * writes the total to a file when the process exits.
 *
 *   qemu-aarch64 -plugin ./qemu_insn_count.so,out=FILE PROGRAM ...
 *
 * Each translation block gets an execution callback carrying its length;
 * the count is exact (every executed block, all threads, atomically added)
 * and deterministic for a deterministic single-threaded program.
 *
 * Debian 12's qemu-user (7.2) loads plugins but ships none and no
 * qemu-plugin.h; the few entry points used here are declared below as the
 * plugin API, version 1, defines them (they are stable since qemu 4.2).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
typedef struct qemu_info_t qemu_info_t; /* not read */
enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_CB_R_REGS, QEMU_PLUGIN_CB_RW_REGS };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb* tb);
typedef void (*qemu_plugin_vcpu_udata_cb_t)(unsigned int vcpu_index, void* userdata);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void* userdata);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb* tb, qemu_plugin_vcpu_udata_cb_t cb,
                                          enum qemu_plugin_cb_flags flags, void* userdata);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb* tb);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void* userdata);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

static uint64_t g_insns;
static char g_out[4096];

static void on_exec(unsigned int vcpu_index, void* userdata) {
  (void)vcpu_index;
  __atomic_fetch_add(&g_insns, (uint64_t)(uintptr_t)userdata, __ATOMIC_RELAXED);
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb* tb) {
  (void)id;
  qemu_plugin_register_vcpu_tb_exec_cb(tb, on_exec, QEMU_PLUGIN_CB_NO_REGS,
                                       (void*)(uintptr_t)qemu_plugin_tb_n_insns(tb));
}

static void write_count(qemu_plugin_id_t id, void* userdata) {
  (void)id;
  (void)userdata;
  FILE* f = fopen(g_out, "w");
  if (f == NULL) {
    fprintf(stderr, "qemu_insn_count: cannot write %s\n", g_out);
    return;
  }
  fprintf(f, "%llu\n", (unsigned long long)__atomic_load_n(&g_insns, __ATOMIC_RELAXED));
  fclose(f);
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t* info,
                                                               int argc, char** argv) {
  (void)info;
  for (int i = 0; i < argc; ++i) {
    if (strncmp(argv[i], "out=", 4) == 0) snprintf(g_out, sizeof g_out, "%s", argv[i] + 4);
  }
  if (g_out[0] == '\0') {
    fprintf(stderr, "qemu_insn_count: usage: -plugin qemu_insn_count.so,out=FILE\n");
    return 1;
  }
  qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
  qemu_plugin_register_atexit_cb(id, write_count, NULL);
  return 0;
}
