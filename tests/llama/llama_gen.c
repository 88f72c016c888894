// SPDX-License-Identifier: Apache-2.0
/*
 * llama-gen: the smallest honest llama.cpp client. Links the prebuilt
 * libllama.so that npm's @node-llama-cpp/linux-x64 ships (headers come from
 * the llama.cpp git bundle in the same npm install), loads a GGUF and does
 * greedy generation, printing token ids and timings. It is "unmodified
 * llama.cpp": every load path (fopen, posix_fadvise, mmap(MAP_POPULATE),
 * posix_madvise(WILLNEED), partial munmap, close) is libllama's own.
 *
 * usage: llama-gen --backends DIR --model FILE [--mode mmap|none] [--n 16]
 *                  [--text "..."] [--threads 1] [--hold] [--no-repack] [--verbose]
 *                  [--segv-handler before|after] [--pause-at N]
 * Output (stdout, one per line):
 *   load_ms <ms>         llama_model_load_from_file (API-ready)
 *   first_token_ms <ms>  from the start of the load to the first sampled token
 *   total_ms <ms>
 *   prompt <ids...>
 *   tokens <ids...>
 * --segv-handler: install a SIGSEGV handler of our own, as runtimes do (crash
 * reporters, JITs), before the model load (sigaction) or after it (signal).
 * It owns one PROT_NONE page: a fault there makes the page readable; any
 * other SIGSEGV it gets prints "foreign_segv" and exits 5 (a pool fault must
 * never reach it). After generating, the page is touched once:
 *   own_segv <handled count>
 * --hold: after printing, write "holding" and wait for EOF on stdin (so a
 * test can inspect the live process: PSS, fdinfo, pool accounting).
 * --pause-at N: after N generated tokens write "paused" and wait for a line
 * on stdin (a bench reads what the load and prefill cost before the decode
 * steps); the wait is not in total_ms.
 * Exit status: 0 ok, 1 llama.cpp refused (the message is on stderr), 2 usage.
 */
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "ggml-backend.h"
#include "llama.h"

static bool g_verbose = false;

static void log_cb(enum ggml_log_level level, const char *text, void *user) {
  (void)user;
  if (g_verbose || level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static bool quiet_progress(float progress, void *user) {
  (void)progress;
  (void)user;
  return true;
}

static volatile unsigned char *g_own_page = NULL;
static size_t g_own_len = 0;
static volatile sig_atomic_t g_own_handled = 0;
static volatile sig_atomic_t g_own_touching = 0;

static void own_segv(int sig) {
  (void)sig;
  /* signal(): no siginfo. Until our own touch (the page is PROT_NONE and
   * touched once, after generating) no SIGSEGV may reach us at all. */
  if (g_own_touching && g_own_handled == 0 && g_own_page != NULL) {
    mprotect((void *)g_own_page, g_own_len, PROT_READ);
    g_own_handled = g_own_handled + 1;
    return;
  }
  static const char msg[] = "foreign_segv\n";
  (void)!write(1, msg, sizeof msg - 1);
  _exit(5);
}

static void own_segv_info(int sig, siginfo_t *si, void *uc) {
  (void)uc;
  const unsigned char *a = (const unsigned char *)si->si_addr;
  if (a >= (const unsigned char *)g_own_page && a < (const unsigned char *)g_own_page + g_own_len) {
    own_segv(sig);
    return;
  }
  static const char msg[] = "foreign_segv\n";
  (void)!write(1, msg, sizeof msg - 1);
  _exit(5);
}

static void install_segv_handler(bool with_signal) {
  g_own_len = (size_t)sysconf(_SC_PAGESIZE);
  g_own_page = mmap(NULL, g_own_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (with_signal) {
    signal(SIGSEGV, own_segv);
  } else {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = own_segv_info;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
  }
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static llama_token argmax(const float *logits, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return (llama_token)best;
}

static void usage(void) {
  fputs("usage: llama-gen --backends DIR --model FILE [--mode mmap|none] [--n 16] [--text T] [--threads 1] "
        "[--hold] [--no-repack] [--verbose] [--segv-handler before|after] [--pause-at N]\n",
        stderr);
}

int main(int argc, char **argv) {
  const char *backends = NULL, *model_path = NULL, *mode = "mmap", *text = "Hello world, this is a test";
  const char *segv = NULL;
  int n_gen = 16, threads = 1, pause_at = 0;
  bool hold = false, no_repack = false;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--hold") == 0) { hold = true; continue; }
    if (strcmp(a, "--verbose") == 0) { g_verbose = true; continue; }
    if (strcmp(a, "--no-repack") == 0) { no_repack = true; continue; }
    if (v == NULL) { usage(); return 2; }
    ++i;
    if (strcmp(a, "--backends") == 0) backends = v;
    else if (strcmp(a, "--model") == 0) model_path = v;
    else if (strcmp(a, "--mode") == 0) mode = v;
    else if (strcmp(a, "--n") == 0) n_gen = atoi(v);
    else if (strcmp(a, "--threads") == 0) threads = atoi(v);
    else if (strcmp(a, "--text") == 0) text = v;
    else if (strcmp(a, "--segv-handler") == 0) segv = v;
    else if (strcmp(a, "--pause-at") == 0) pause_at = atoi(v);
    else { usage(); return 2; }
  }
  if (backends == NULL || model_path == NULL || n_gen < 1 || threads < 1 || pause_at < 0 ||
      (strcmp(mode, "mmap") != 0 && strcmp(mode, "none") != 0) ||
      (segv != NULL && strcmp(segv, "before") != 0 && strcmp(segv, "after") != 0)) {
    usage();
    return 2;
  }

  llama_log_set(log_cb, NULL);
  /* The npm build ships the CPU backend as one plugin per ISA level. */
  ggml_backend_load_all_from_path(backends);
  llama_backend_init();

  struct llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.progress_callback = quiet_progress;
  /* llama.cpp's default copies Q4_0/Q4_K weights into private, repacked
   * buffers on CPUs with AVX2/AVX512/NEON (llama-cli --no-repack turns it
   * off); those copies are per process, whatever the mapping is. */
  if (no_repack) mp.use_extra_bufts = false;
  mp.load_mode = strcmp(mode, "mmap") == 0 ? LLAMA_LOAD_MODE_MMAP : LLAMA_LOAD_MODE_NONE;

  if (segv != NULL && strcmp(segv, "before") == 0) install_segv_handler(false);
  const double t0 = now_ms();
  struct llama_model *model = llama_model_load_from_file(model_path, mp);
  const double t_load = now_ms();
  if (segv != NULL && strcmp(segv, "after") == 0) install_segv_handler(true);
  if (model == NULL) {
    fprintf(stderr, "llama-gen: llama.cpp could not load %s\n", model_path);
    return 1;
  }
  const struct llama_vocab *vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);

  struct llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 256;
  cp.n_batch = 256;
  cp.n_ubatch = 256;
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  cp.no_perf = true;
  struct llama_context *ctx = llama_init_from_model(model, cp);
  if (ctx == NULL) {
    fprintf(stderr, "llama-gen: cannot create a context for %s\n", model_path);
    return 1;
  }

  llama_token prompt[128];
  const int n_prompt = llama_tokenize(vocab, text, (int32_t)strlen(text), prompt, 128, true, false);
  if (n_prompt <= 0) {
    fprintf(stderr, "llama-gen: tokenizing the prompt failed (%d)\n", n_prompt);
    return 1;
  }

  llama_token out[1024];
  if (n_gen > 1024) n_gen = 1024;
  double t_first = 0, paused = 0;
  struct llama_batch batch = llama_batch_get_one(prompt, n_prompt);
  for (int i = 0; i < n_gen; ++i) {
    if (i == pause_at && i > 0) {
      const double p0 = now_ms();
      printf("paused\n");
      fflush(stdout);
      char c = 0;
      while (read(0, &c, 1) == 1 && c != '\n') {
      }
      paused += now_ms() - p0;
    }
    if (llama_decode(ctx, batch) != 0) {
      fprintf(stderr, "llama-gen: llama_decode failed at token %d\n", i);
      return 1;
    }
    out[i] = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
    if (i == 0) t_first = now_ms();
    batch = llama_batch_get_one(&out[i], 1);
  }
  const double t_end = now_ms() - paused;

  printf("load_ms %.3f\nfirst_token_ms %.3f\ntotal_ms %.3f\nprompt", t_load - t0, t_first - t0, t_end - t0);
  for (int i = 0; i < n_prompt; ++i) printf(" %d", prompt[i]);
  printf("\ntokens");
  for (int i = 0; i < n_gen; ++i) printf(" %d", out[i]);
  printf("\n");
  if (segv != NULL) {
    g_own_touching = 1;
    const unsigned v = g_own_page[0];
    printf("own_segv %d %u\n", (int)g_own_handled, v);
  }
  fflush(stdout);

  if (hold) {
    printf("holding\n");
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }
  }
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
