// Prompt-lookup n-gram matcher: given the token history, find the most recent earlier
// occurrence of its last n tokens and propose the tokens that followed it as a draft.
//
// Semantics (the specification; tests/test_ngram.py checks both backends against it):
//   propose(history, k, min_n, max_n): for n from max_n down to min_n, if len(history) > n,
//   find the most recent start i < len(history) - n with history[i:i+n] == history[-n:];
//   if found, return history[i+n : i+n+k] (possibly shorter than k, never empty).
//   If no n matches, return [].
//
// Plain C++17 with no Python or torch headers: ngram_bindings.cpp is the only Python-aware file.
// Token ids are int32 (vocabularies are far below 2^31); inputs of int32 or int64 are
// validated to lie in [0, kMaxToken] and rejected with std::invalid_argument otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace specrt {

using Token = int32_t;
constexpr int64_t kMaxToken = 2147483647;  // INT32_MAX
// The longest n-gram an index keeps (one table each, made up front): such matches never occur
// in text, and a huge max_n would allocate tables by the gigabyte.
constexpr int64_t kMaxNgram = 1024;

// Throw std::invalid_argument unless k >= 1 / 1 <= min_n <= max_n <= kMaxNgram. The messages
// are mirrored word for word by the Python fallback (specrt/spec/drafters/ngram_index.py).
// Sizes are taken as int64 so that any Python int pybind can convert gets the same answer as
// the fallback: k and limit above INT32_MAX mean "all there is".
void check_k(int64_t k);
void check_ngram_sizes(int64_t min_n, int64_t max_n);

// Throw std::invalid_argument naming the first token outside [0, kMaxToken] and its index.
void check_tokens(const int32_t* tokens, size_t count);
void check_tokens(const int64_t* tokens, size_t count);

// Incremental index over a growing token history.
//
// For each n in [min_n, max_n] an open-addressing hash table maps every n-gram seen so
// far to the end position of its most recent occurrence. The table stores only that
// position (4 bytes a slot) and finds the key by comparing the actual tokens, so lookups
// are exact: a hash collision costs a probe, never a wrong answer. On each appended token
// the n-gram ending there is looked up before it is overwritten, which yields the
// *previous* occurrence of the current suffix; that is all propose needs, so propose never
// touches the tables and costs O(max_n + k) whatever the history length.
class NgramIndex {
 public:
  NgramIndex(int64_t min_n, int64_t max_n);

  // Append committed tokens. All tokens are validated before any is appended, so a bad
  // token leaves the index unchanged.
  void extend(const int32_t* tokens, size_t count);
  void extend(const int64_t* tokens, size_t count);
  void extend(const std::vector<Token>& tokens) { extend(tokens.data(), tokens.size()); }

  // The draft as a half-open range [begin, end) of positions in tokens(); empty when no
  // n-gram matches. Saves a copy when the caller converts straight into its own type.
  std::pair<size_t, size_t> propose_range(int64_t k) const;
  std::vector<Token> propose(int64_t k) const;
  // The suffix length n that propose matches on (the longest with an earlier occurrence),
  // 0 when none does. A longer match is a better guess: the adaptive planner keeps its
  // acceptance per n.
  int match_length() const;
  // How many tokens, up to `limit`, the history's suffix shares with the text that ends
  // where propose copies from: match_length() when that is below max_n, and possibly more
  // when the whole max_n-gram matched (0 when nothing matches). A long agreement means the
  // text is being copied, so the copy is likely to go on.
  int agreement(int64_t limit) const;

  void reset();
  size_t size() const { return tokens_.size(); }
  int min_n() const { return min_n_; }
  int max_n() const { return max_n_; }
  const std::vector<Token>& tokens() const { return tokens_; }

 private:
  // Open-addressing (linear probing) table of end positions for one n-gram length.
  struct Table {
    std::vector<uint32_t> slots;  // [capacity], kEmpty or the end position of an n-gram
    size_t count = 0;             // occupied slots
  };

  template <typename T>
  void extend_checked(const T* tokens, size_t count);
  void append(Token token);
  // Returns the previous end position of the n-gram ending at `end` (kNone if it is new)
  // and records `end` as its latest occurrence.
  uint32_t upsert(Table& table, int n, uint32_t end, uint64_t hash);
  void grow(Table& table, int n);
  uint64_t hash_ngram(uint32_t end, int n) const;
  bool same_ngram(uint32_t a, uint32_t b, int n) const;

  int min_n_;
  int max_n_;
  std::vector<Token> tokens_;
  std::vector<Table> tables_;       // [max_n - min_n + 1], tables_[n - min_n]
  std::vector<uint32_t> prev_end_;  // [max_n - min_n + 1], previous end of the current
                                    // suffix n-gram, kNone if it has none
};

// Stateless reference-style matcher: a direct backward scan, O(len * max_n) per call.
// Meant for one-off calls and as an independent check of the index, not for decoding loops.
std::vector<Token> propose(const int32_t* history, size_t len, int64_t k, int64_t min_n,
                           int64_t max_n);
std::vector<Token> propose(const int64_t* history, size_t len, int64_t k, int64_t min_n,
                           int64_t max_n);

}  // namespace specrt
