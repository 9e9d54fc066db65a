// Prompt-lookup n-gram matcher: the incremental NgramIndex and the stateless scan.
// See ngram.h for the semantics and the index design.
#include "ngram.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace specrt {

namespace {

constexpr uint32_t kNone = UINT32_MAX;  // "no position": empty slot / no previous match
// Positions are stored as uint32 and kNone is reserved.
constexpr size_t kMaxHistory = static_cast<size_t>(UINT32_MAX) - 1;
constexpr size_t kMinCapacity = 16;
constexpr uint64_t kSeed = 0x243F6A8885A308D3ULL;

// One token folded into the running n-gram hash (FxHash-style). The n-gram ending at
// `end` is hashed from its last token backwards, so the hashes of all lengths ending at a
// position come out of one pass in append().
inline uint64_t hash_step(uint64_t h, Token token) {
  h = (h << 5 | h >> 59) ^ static_cast<uint32_t>(token);
  return h * 0x9E3779B97F4A7C15ULL;
}

// Murmur3 finalizer: linear probing needs well-mixed low bits, hash_step's are weak.
inline uint64_t fmix64(uint64_t h) {
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDULL;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ULL;
  h ^= h >> 33;
  return h;
}

template <typename T>
void check_tokens_impl(const T* tokens, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const int64_t t = static_cast<int64_t>(tokens[i]);
    if (t < 0 || t > kMaxToken) {
      throw std::invalid_argument("token ids must be integers in [0, " +
                                  std::to_string(kMaxToken) + "], got " + std::to_string(t) +
                                  " at index " + std::to_string(i));
    }
  }
}

template <typename T>
std::vector<Token> propose_scan(const T* history, size_t len, int64_t k, int64_t min_n,
                                int64_t max_n) {
  check_k(k);
  check_ngram_sizes(min_n, max_n);
  check_tokens(history, len);
  for (int64_t n = max_n; n >= min_n; --n) {
    const size_t un = static_cast<size_t>(n);
    if (len <= un) continue;
    const T* suffix = history + (len - un);
    // Most recent first: the first hit is the answer for this n.
    for (size_t i = len - un; i-- > 0;) {
      if (std::equal(suffix, suffix + un, history + i)) {
        const size_t begin = i + un;
        const size_t end = std::min(len, begin + static_cast<size_t>(k));
        return std::vector<Token>(history + begin, history + end);
      }
    }
  }
  return {};
}

}  // namespace

void check_k(int64_t k) {
  if (k < 1) throw std::invalid_argument("k must be >= 1, got " + std::to_string(k));
}

void check_ngram_sizes(int64_t min_n, int64_t max_n) {
  if (min_n < 1) throw std::invalid_argument("min_n must be >= 1, got " + std::to_string(min_n));
  if (min_n > max_n) {
    throw std::invalid_argument("min_n must be <= max_n, got min_n=" + std::to_string(min_n) +
                                ", max_n=" + std::to_string(max_n));
  }
  if (max_n > kMaxNgram) {
    throw std::invalid_argument("max_n must be <= " + std::to_string(kMaxNgram) + ", got " +
                                std::to_string(max_n));
  }
}

void check_tokens(const int32_t* tokens, size_t count) { check_tokens_impl(tokens, count); }
void check_tokens(const int64_t* tokens, size_t count) { check_tokens_impl(tokens, count); }

NgramIndex::NgramIndex(int64_t min_n, int64_t max_n)
    : min_n_(static_cast<int>(min_n)), max_n_(static_cast<int>(max_n)) {
  check_ngram_sizes(min_n, max_n);   // before min_n_ / max_n_ are used: within int once it passes
  const size_t levels = static_cast<size_t>(max_n - min_n) + 1;
  tables_.resize(levels);
  prev_end_.assign(levels, kNone);
}

void NgramIndex::extend(const int32_t* tokens, size_t count) { extend_checked(tokens, count); }
void NgramIndex::extend(const int64_t* tokens, size_t count) { extend_checked(tokens, count); }

template <typename T>
void NgramIndex::extend_checked(const T* tokens, size_t count) {
  check_tokens(tokens, count);
  if (count > kMaxHistory - tokens_.size()) {
    throw std::length_error("NgramIndex holds at most " + std::to_string(kMaxHistory) +
                            " tokens");
  }
  // No reserve(size + count) here: it reallocates to the exact size, so a decode loop that
  // extends one token at a time would copy the whole history on every call.
  for (size_t i = 0; i < count; ++i) append(static_cast<Token>(tokens[i]));
}

void NgramIndex::append(Token token) {
  const uint32_t end = static_cast<uint32_t>(tokens_.size());
  tokens_.push_back(token);
  uint64_t h = kSeed;
  for (int n = 1; n <= max_n_; ++n) {
    if (static_cast<uint32_t>(n) > end + 1) {
      // No n-gram of this length (or longer) ends here yet.
      for (int m = std::max(n, min_n_); m <= max_n_; ++m) prev_end_[m - min_n_] = kNone;
      return;
    }
    h = hash_step(h, tokens_[end + 1 - n]);
    if (n >= min_n_) prev_end_[n - min_n_] = upsert(tables_[n - min_n_], n, end, h);
  }
}

uint32_t NgramIndex::upsert(Table& table, int n, uint32_t end, uint64_t hash) {
  // Keep the load factor <= 1/2 so linear probes stay short.
  if ((table.count + 1) * 2 > table.slots.size()) grow(table, n);
  const size_t mask = table.slots.size() - 1;
  for (size_t i = fmix64(hash) & mask;; i = (i + 1) & mask) {
    const uint32_t slot = table.slots[i];
    if (slot == kNone) {
      table.slots[i] = end;
      ++table.count;
      return kNone;
    }
    if (same_ngram(slot, end, n)) {
      table.slots[i] = end;
      return slot;
    }
  }
}

void NgramIndex::grow(Table& table, int n) {
  std::vector<uint32_t> old = std::move(table.slots);
  table.slots.assign(std::max(kMinCapacity, old.size() * 2), kNone);
  const size_t mask = table.slots.size() - 1;
  // Keys in the old table are distinct, so reinsertion needs no token comparisons.
  for (const uint32_t end : old) {
    if (end == kNone) continue;
    size_t i = fmix64(hash_ngram(end, n)) & mask;
    while (table.slots[i] != kNone) i = (i + 1) & mask;
    table.slots[i] = end;
  }
}

uint64_t NgramIndex::hash_ngram(uint32_t end, int n) const {
  uint64_t h = kSeed;
  for (int m = 1; m <= n; ++m) h = hash_step(h, tokens_[end + 1 - m]);
  return h;
}

bool NgramIndex::same_ngram(uint32_t a, uint32_t b, int n) const {
  const Token* pa = tokens_.data() + (a + 1 - n);
  const Token* pb = tokens_.data() + (b + 1 - n);
  return std::equal(pa, pa + n, pb);
}

int NgramIndex::match_length() const {
  for (int n = max_n_; n >= min_n_; --n)
    if (prev_end_[n - min_n_] != kNone) return n;
  return 0;
}

int NgramIndex::agreement(int64_t limit) const {
  const int n = match_length();
  if (n == 0 || limit <= 0) return 0;
  // The occurrence ends at `end` < size - 1: compare backwards from both ends.
  const size_t end = prev_end_[n - min_n_];
  const size_t last = tokens_.size() - 1;
  const size_t most = std::min(static_cast<size_t>(limit), end + 1);
  size_t j = 0;
  while (j < most && tokens_[end - j] == tokens_[last - j]) ++j;
  return static_cast<int>(j);
}

std::pair<size_t, size_t> NgramIndex::propose_range(int64_t k) const {
  check_k(k);
  const int n = match_length();
  if (n == 0) return {0, 0};
  const size_t begin = static_cast<size_t>(prev_end_[n - min_n_]) + 1;
  return {begin, std::min(tokens_.size(), begin + static_cast<size_t>(k))};
}

std::vector<Token> NgramIndex::propose(int64_t k) const {
  const auto [begin, end] = propose_range(k);
  return std::vector<Token>(tokens_.begin() + begin, tokens_.begin() + end);
}

void NgramIndex::reset() {
  // Release the memory too: an index is reset between unrelated requests.
  std::vector<Token>().swap(tokens_);
  for (Table& table : tables_) table = Table{};
  std::fill(prev_end_.begin(), prev_end_.end(), kNone);
}

std::vector<Token> propose(const int32_t* history, size_t len, int64_t k, int64_t min_n,
                           int64_t max_n) {
  return propose_scan(history, len, k, min_n, max_n);
}

std::vector<Token> propose(const int64_t* history, size_t len, int64_t k, int64_t min_n,
                           int64_t max_n) {
  return propose_scan(history, len, k, min_n, max_n);
}

}  // namespace specrt
