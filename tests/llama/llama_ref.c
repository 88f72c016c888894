// SPDX-License-Identifier: Apache-2.0
/*
 * llama-ref: what the real llama.cpp says about a model, for the engine's
 * agreement tests (tests/llama/infer_agreement_test.cpp). Links the same
 * prebuilt libllama.so as llama-gen.
 *
 * usage: llama-ref --backends DIR --model FILE [--kv f32|f16] [--flash 0|1]
 *                  [--n 16] [--threads 1] (--text T | --tokenize FILE)
 * --text: tokenizes T (BOS added as the vocabulary says), decodes it in one
 *   batch, then greedy-generates n tokens one at a time. Prints
 *     prompt <ids...>
 *     tokens <ids...>
 *     logits <step> <n_vocab values>   (step 0: after the prompt; step i:
 *                                       after generated token i-1)
 * --tokenize: FILE holds texts separated by the byte 0x1E (so a text may
 *   contain newlines); prints "ids <ids...>" per text (llama_tokenize with
 *   add_special = true, parse_special = false).
 * Exit status: 0 ok, 1 llama.cpp refused (message on stderr), 2 usage.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "llama.h"

static void log_cb(enum ggml_log_level level, const char *text, void *user) {
  (void)user;
  if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static bool quiet_progress(float progress, void *user) {
  (void)progress;
  (void)user;
  return true;
}

static int print_ids(const struct llama_vocab *vocab, const char *label, const char *text, size_t len) {
  int cap = (int)len + 16;
  llama_token *ids = malloc(sizeof(llama_token) * (size_t)cap);
  if (ids == NULL) return -1;
  const int n = llama_tokenize(vocab, text, (int32_t)len, ids, cap, true, false);
  if (n < 0) {
    free(ids);
    return -1;
  }
  printf("%s", label);
  for (int i = 0; i < n; ++i) printf(" %d", ids[i]);
  printf("\n");
  free(ids);
  return n;
}

static void print_logits(int step, const float *logits, int n) {
  printf("logits %d", step);
  for (int i = 0; i < n; ++i) printf(" %.9g", (double)logits[i]);
  printf("\n");
}

static llama_token argmax(const float *logits, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return (llama_token)best;
}

int main(int argc, char **argv) {
  const char *backends = NULL, *model_path = NULL, *text = NULL, *tok_file = NULL, *kv = "f32";
  int n_gen = 16, threads = 1, flash = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *a = argv[i], *v = argv[i + 1];
    if (strcmp(a, "--backends") == 0) backends = v;
    else if (strcmp(a, "--model") == 0) model_path = v;
    else if (strcmp(a, "--kv") == 0) kv = v;
    else if (strcmp(a, "--flash") == 0) flash = atoi(v);
    else if (strcmp(a, "--n") == 0) n_gen = atoi(v);
    else if (strcmp(a, "--threads") == 0) threads = atoi(v);
    else if (strcmp(a, "--text") == 0) text = v;
    else if (strcmp(a, "--tokenize") == 0) tok_file = v;
    else { fprintf(stderr, "llama-ref: unknown option %s\n", a); return 2; }
  }
  if (argc % 2 == 0 || backends == NULL || model_path == NULL || (text == NULL) == (tok_file == NULL) || n_gen < 1 ||
      n_gen > 512 || threads < 1 || (strcmp(kv, "f32") != 0 && strcmp(kv, "f16") != 0)) {
    fputs("usage: llama-ref --backends DIR --model FILE [--kv f32|f16] [--flash 0|1] [--n 16] [--threads 1] "
          "(--text T | --tokenize FILE)\n", stderr);
    return 2;
  }

  llama_log_set(log_cb, NULL);
  ggml_backend_load_all_from_path(backends);
  llama_backend_init();
  struct llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.progress_callback = quiet_progress;
  struct llama_model *model = llama_model_load_from_file(model_path, mp);
  if (model == NULL) {
    fprintf(stderr, "llama-ref: llama.cpp could not load %s\n", model_path);
    return 1;
  }
  const struct llama_vocab *vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);

  if (tok_file != NULL) {
    FILE *f = fopen(tok_file, "rb");
    if (f == NULL) { perror(tok_file); return 1; }
    static char buf[1 << 20];
    const size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t start = 0;
    for (size_t i = 0; i <= len; ++i) {
      if (i == len || buf[i] == 0x1E) {
        if (print_ids(vocab, "ids", buf + start, i - start) < 0) {
          fprintf(stderr, "llama-ref: llama_tokenize failed\n");
          return 1;
        }
        start = i + 1;
      }
    }
    llama_model_free(model);
    llama_backend_free();
    return 0;
  }

  struct llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 1024;
  cp.n_batch = 1024;
  cp.n_ubatch = 1024;
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  cp.no_perf = true;
  cp.flash_attn_type = flash ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.type_k = strcmp(kv, "f32") == 0 ? GGML_TYPE_F32 : GGML_TYPE_F16;
  cp.type_v = cp.type_k;
  struct llama_context *ctx = llama_init_from_model(model, cp);
  if (ctx == NULL) {
    fprintf(stderr, "llama-ref: cannot create a context for %s\n", model_path);
    return 1;
  }
  llama_token prompt[1024];
  const int n_prompt = llama_tokenize(vocab, text, (int32_t)strlen(text), prompt, 1024 - 512, true, false);
  if (n_prompt <= 0) {
    fprintf(stderr, "llama-ref: tokenizing the prompt failed (%d)\n", n_prompt);
    return 1;
  }
  llama_token out[512];
  struct llama_batch batch = llama_batch_get_one(prompt, n_prompt);
  printf("prompt");
  for (int i = 0; i < n_prompt; ++i) printf(" %d", prompt[i]);
  printf("\n");
  for (int i = 0; i < n_gen; ++i) {
    if (llama_decode(ctx, batch) != 0) {
      fprintf(stderr, "llama-ref: llama_decode failed at token %d\n", i);
      return 1;
    }
    const float *logits = llama_get_logits_ith(ctx, -1);
    print_logits(i, logits, n_vocab);
    out[i] = argmax(logits, n_vocab);
    batch = llama_batch_get_one(&out[i], 1);
  }
  printf("tokens");
  for (int i = 0; i < n_gen; ++i) printf(" %d", out[i]);
  printf("\n");
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
