// zinfinity-train with model.type "gpt" end to end: training on a text file evaluates in nats
// per byte beside the text's byte entropies and learns below them, --generate continues a
// prompt from the checkpoint, activation checkpointing (on the device, in host memory, on NVMe)
// leaves every loss bitwise unchanged, and bad text, sizes and keys fail with the culprit named.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/test_seed.h"

namespace zinf {
namespace {

struct RunResult {
    int exit_code = -1;
    std::string out;
};

RunResult train(const test::TempDir& dir, const std::string& args) {
    const std::string out = dir.file("out.txt");
    const std::string cmd = std::string(ZINF_TRAIN_BINARY) + " " + args + " > " + out + " 2>&1";
    const int status = std::system(cmd.c_str());
    RunResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = test::read_text(out);
    return r;
}

void write_file(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    out << text;
}

std::vector<std::string> lines(const std::string& path) {
    std::vector<std::string> v;
    std::ifstream in(path);
    for (std::string l; std::getline(in, l);) v.push_back(l);
    return v;
}

// A small corpus with structure a tiny model learns in a few dozen steps.
std::string corpus() {
    const char* sentences[] = {
        "the quick brown fox jumps over the lazy dog.\n",
        "a stitch in time saves nine.\n",
        "the early bird catches the worm.\n",
        "all that glitters is not gold.\n",
    };
    std::string text;
    for (int i = 0; i < 300; ++i) text += sentences[(i * 7 + i / 3) % 4];
    return text;
}

// A tiny gpt on `text_path` (flags after it override).
std::string tiny_gpt(const test::TempDir& dir, const std::string& text_path,
                     const std::string& extra_json = "") {
    static int configs = 0;  // one file per config: a test builds several before running them
    const std::string config = dir.file("gpt" + std::to_string(configs++) + ".json");
    write_file(config, R"({
  "train_micro_batch_size_per_gpu": 8,
  "steps_per_print": 10,
  "seed": 7,
  "gradient_clipping": 1.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.0}},
  "model": {"type": "gpt", "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 32},
  "data": {"dataset": "text", "path": ")" +
                           text_path + R"(", "epochs": 20}
  )" + extra_json + "}");
    return "--config " + config;
}

// The number after the first (or last) occurrence of `prefix` in `out`; -1 when absent.
// (Plain string search: std::regex trips GCC 12's -Wmaybe-uninitialized under the sanitizers.)
double number_after(const std::string& out, const std::string& prefix, bool last = false) {
    const std::size_t at = last ? out.rfind(prefix) : out.find(prefix);
    if (at == std::string::npos) return -1;
    return std::strtod(out.c_str() + at + prefix.size(), nullptr);
}

TEST(GptCliTest, LearnsATextBelowItsBigramEntropyAndContinuesAPrompt) {
    test::TempDir dir("gpt");
    const std::string text = dir.file("corpus.txt");
    write_file(text, corpus());
    const RunResult r = train(dir, tiny_gpt(dir, text) +
                                       " --max-steps 300 --eval-every 100 "
                                       "--save-dir " +
                                       dir.file("ckpt"));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    // The data line, the periodic evaluation and the one at the end, with the entropies.
    EXPECT_NE(r.out.find("training text entropy: unigram"), std::string::npos) << r.out;
    const std::size_t at = r.out.find("step 100 (epoch ");
    ASSERT_NE(at, std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("): validation loss", at), r.out.find(')', at)) << r.out;
    EXPECT_NE(r.out.find("perplexity"), std::string::npos);
    const double unigram = number_after(r.out, "unigram entropy ");
    const double bigram = number_after(r.out, ", bigram ", /*last=*/true);
    const double loss = number_after(r.out, "validation loss ", /*last=*/true);
    ASSERT_GT(bigram, 0) << r.out;
    ASSERT_GT(unigram, bigram);
    ASSERT_GT(loss, 0) << r.out;
    EXPECT_LT(loss, bigram) << r.out;  // it learned more than which byte follows which

    // Greedy continuation from the checkpoint (within one context window): the prompt, then the
    // rest of the corpus' sentence.
    const RunResult g = train(dir, tiny_gpt(dir, text) + " --resume " + dir.file("ckpt") +
                                       " --generate 'the quick brown' --temperature 0 "
                                       "--generate-bytes 16");
    ASSERT_EQ(g.exit_code, 0) << g.out;
    EXPECT_NE(g.out.find("the quick brown fox jumps over "), std::string::npos) << g.out;
    // Sampling at a temperature is reproducible for a seed.
    const std::string sample_args = tiny_gpt(dir, text) + " --resume " + dir.file("ckpt") +
                                    " --generate 'all that' --temperature 1 --generate-bytes 30";
    const RunResult s1 = train(dir, sample_args);
    const RunResult s2 = train(dir, sample_args);
    ASSERT_EQ(s1.exit_code, 0) << s1.out;
    EXPECT_EQ(s1.out, s2.out);
}

// data.eval_samples (and --eval-samples over it) evaluates on the first samples only, in whole
// batches, and says so; a bad count is refused by name.
TEST(GptCliTest, EvalSamplesEvaluatesTheFirstBatchesOnly) {
    test::TempDir dir("gpt");
    const std::string text = dir.file("corpus.txt");
    write_file(text, corpus());
    const std::string args = tiny_gpt(dir, text) + " --set data.eval_samples=20 --max-steps 2";
    const RunResult part = train(dir, args);
    ASSERT_EQ(part.exit_code, 0) << part.out;
    // 20 samples in batches of 8: 3 batches.
    EXPECT_NE(part.out.find("validation loss"), std::string::npos) << part.out;
    EXPECT_NE(part.out.find(", on the first 24 of "), std::string::npos) << part.out;
    const RunResult all = train(dir, args + " --eval-samples 0");
    ASSERT_EQ(all.exit_code, 0) << all.out;
    EXPECT_NE(all.out.find("validation loss"), std::string::npos) << all.out;
    EXPECT_EQ(all.out.find(", on the first "), std::string::npos) << all.out;
    EXPECT_NE(number_after(part.out, "validation loss "),
              number_after(all.out, "validation loss "));
    const RunResult two = train(dir, args + " --eval-samples 9");
    EXPECT_NE(two.out.find(", on the first 16 of "), std::string::npos) << two.out;
    const RunResult bad = train(dir, args + " --eval-samples many");
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.out.find("--eval-samples"), std::string::npos) << bad.out;
}

TEST(GptCliTest, CheckpointingOnDeviceInHostMemoryOrOnNvmeLeavesEveryLossBitwise) {
    test::TempDir dir("gpt");
    const std::string text = dir.file("corpus.txt");
    write_file(text, corpus());
    std::vector<std::vector<std::string>> logs;
    const std::string variants[] = {
        "",
        R"(, "activation_checkpointing": {"profile": true})",
        R"(, "activation_checkpointing": {"cpu_checkpointing": true, "contiguous_memory_optimization": true, "synchronize_checkpoint_boundary": true})",
        R"(, "activation_checkpointing": {"nvme_checkpointing": true, "nvme_path": ")" +
            dir.file("activations") + R"("})",
    };
    for (int v = 0; v < 4; ++v) {
        const std::string log = dir.file("losses" + std::to_string(v));
        std::string args = tiny_gpt(dir, text, variants[v]) +
                           " --max-steps 6 --no-eval --set model.dropout=0.1 --set "
                           "steps_per_print=3 --loss-log " +
                           log;
        if (v > 0) args += " --set model.checkpoint_activations=true";
        const RunResult r = train(dir, args);
        ASSERT_EQ(r.exit_code, 0) << r.out;
        if (v == 1) {
            EXPECT_NE(r.out.find("checkpointed blocks (activation_checkpointing.profile)"),
                      std::string::npos)
                << r.out;
        }
        if (v == 3) {
            EXPECT_NE(r.out.find("activation checkpoints:"), std::string::npos) << r.out;
            EXPECT_NE(r.out.find("on NVMe: written"), std::string::npos) << r.out;
        }
        logs.push_back(lines(log));
        ASSERT_EQ(logs.back().size(), 6u);
    }
    EXPECT_EQ(logs[0], logs[1]);
    EXPECT_EQ(logs[0], logs[2]);
    EXPECT_EQ(logs[0], logs[3]);
}

// Parameters, states and kept activations on NVMe, with --measure-overlap: its compute-only
// pass discards the kept activations' I/O too (the model's own store).
TEST(GptCliTest, EverythingOnNvmeTrainsAndMeasuresOverlap) {
    test::TempDir dir("gpt");
    const std::string text = dir.file("corpus.txt");
    write_file(text, corpus());
    const std::string swap = dir.file("swap");
    const std::string extra = R"(, "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "sub_group_size": 4096,
    "offload_param": {"device": "nvme", "nvme_path": ")" +
                              swap + R"("},
    "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                              swap + R"(",
                          "stream_gradients": true}},
  "activation_checkpointing": {"nvme_checkpointing": true, "nvme_path": ")" +
                              dir.file("activations") + R"("})";
    const RunResult r = train(dir, tiny_gpt(dir, text, extra) +
                                       " --max-steps 2 --no-eval --measure-overlap "
                                       "--overlap-steps 1 --set model.checkpoint_activations=true");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("gradients: nvme (streamed"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("on NVMe: written"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("real / max(compute-only, I/O-only)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("its I/O discarded: "), std::string::npos) << r.out;
}

TEST(GptCliTest, CheckpointingKeysWithoutEffectWarn) {
    test::TempDir dir("gpt");
    const std::string text = dir.file("corpus.txt");
    write_file(text, corpus());
    RunResult r = train(
        dir, tiny_gpt(dir, text, R"(, "activation_checkpointing": {"cpu_checkpointing": true})") +
                 " --max-steps 1 --no-eval");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("activation_checkpointing: has no effect unless"), std::string::npos)
        << r.out;
    r = train(
        dir,
        tiny_gpt(
            dir, text,
            R"(, "activation_checkpointing": {"partition_activations": true, "number_checkpoints": 5})") +
            " --max-steps 1 --no-eval --set model.checkpoint_activations=true");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("partition_activations"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("number_checkpoints: 5 ignored"), std::string::npos) << r.out;
}

TEST(GptCliTest, BadTextSizesAndKeysNameTheCulprit) {
    test::TempDir dir("gpt");
    const std::string good = dir.file("corpus.txt");
    write_file(good, corpus());
    struct Case {
        std::string args;
        std::vector<std::string> expect;
    };
    const std::string small = dir.file("small.txt");
    write_file(small, "only forty bytes of text, far too few.\n");
    const std::string empty = dir.file("empty.txt");
    write_file(empty, "");
    const std::string latin1 = dir.file("latin1.txt");
    write_file(latin1, "caf\xe9 au lait, na\xefve\n" + corpus());
    const std::vector<Case> cases = {
        {tiny_gpt(dir, small), {"model.seq_len", small}},
        {tiny_gpt(dir, empty), {empty}},
        {tiny_gpt(dir, latin1), {latin1, "UTF-8", "offset 3"}},
        {tiny_gpt(dir, dir.file("absent.txt")), {dir.file("absent.txt")}},
        {tiny_gpt(dir, good) + " --set model.n_head=3", {"model.d_model", "model.n_head"}},
        {tiny_gpt(dir, good) + " --set model.layers=[4,2]", {"model.layers", "gpt"}},
        {tiny_gpt(dir, good) + " --set data.dataset=synthetic", {"data.dataset"}},
        {tiny_gpt(dir, good) + " --generate hello", {"--generate", "--resume"}},
        {tiny_gpt(dir, good) + " --temperature -1", {"--temperature"}},
    };
    for (const Case& c : cases) {
        const RunResult r = train(dir, c.args);
        EXPECT_NE(r.exit_code, 0) << c.args << "\n" << r.out;
        for (const std::string& e : c.expect) {
            EXPECT_NE(r.out.find(e), std::string::npos) << c.args << ": no '" << e << "' in\n"
                                                        << r.out;
        }
        EXPECT_EQ(r.out.find("Assertion"), std::string::npos) << r.out;
    }
}

}  // namespace
}  // namespace zinf
