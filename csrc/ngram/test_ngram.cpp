// C++-only checks of the n-gram matcher (run by ctest), so the core can be tested without
// Python: hand-written cases, the index against the stateless scan on random streams, and
// argument validation. The exhaustive differential test is tests/test_ngram.py.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "ngram.h"

namespace {

int failures = 0;

#define CHECK(cond)                                                    \
  do {                                                                 \
    if (!(cond)) {                                                     \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                      \
    }                                                                  \
  } while (0)

using specrt::Token;
using Tokens = std::vector<Token>;

Tokens scan(const Tokens& h, int k, int min_n, int max_n) {
  return specrt::propose(h.data(), h.size(), k, min_n, max_n);
}

Tokens indexed(const Tokens& h, int k, int min_n, int max_n) {
  specrt::NgramIndex index(min_n, max_n);
  index.extend(h);
  return index.propose(k);
}

template <typename Fn>
bool throws_invalid(Fn&& fn, const std::string& expected) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    if (expected == e.what()) return true;
    std::fprintf(stderr, "message was: %s\n", e.what());
    return false;
  }
  return false;
}

void test_hand_written() {
  for (auto* propose : {&scan, &indexed}) {
    // The suffix [1, 2] occurred at 0 and 3; the most recent earlier one (3) wins.
    CHECK(propose({1, 2, 7, 1, 2, 9, 1, 2}, 3, 1, 2) == (Tokens{9, 1, 2}));
    // The longest n wins over a more recent shorter match.
    CHECK(propose({5, 1, 2, 3, 2, 3, 1, 2, 3}, 2, 1, 3) == (Tokens{2, 3}));
    // Draft truncated at the end of the history, never empty.
    CHECK(propose({4, 4}, 5, 1, 1) == (Tokens{4}));
    // The suffix occurrence itself does not count.
    CHECK(propose({1, 2, 3}, 2, 1, 3).empty());
    CHECK(propose({}, 2, 1, 3).empty());
    CHECK(propose({7}, 2, 1, 1).empty());
    // len(history) > n is required: [3, 3] has no earlier 2-gram but a 1-gram match.
    CHECK(propose({3, 3}, 4, 1, 2) == (Tokens{3}));
    // min_n above every matching length: nothing.
    CHECK(propose({1, 2, 9, 2}, 4, 2, 3).empty());
  }
}

void test_index_matches_scan() {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    const int alphabet = 1 + static_cast<int>(rng() % 6);
    const int min_n = 1 + static_cast<int>(rng() % 4);
    const int max_n = min_n + static_cast<int>(rng() % 4);
    specrt::NgramIndex index(min_n, max_n);
    Tokens history;
    const int length = static_cast<int>(rng() % 400);
    while (static_cast<int>(history.size()) < length) {
      Tokens chunk(rng() % 5);
      for (Token& t : chunk) t = static_cast<Token>(rng() % alphabet);
      index.extend(chunk);
      history.insert(history.end(), chunk.begin(), chunk.end());
      CHECK(index.size() == history.size());
      for (int k : {1, 3, 8}) CHECK(index.propose(k) == scan(history, k, min_n, max_n));
    }
    index.reset();
    CHECK(index.size() == 0 && index.propose(4).empty());
  }
}

void test_int64_input() {
  const std::vector<int64_t> wide = {1, 2, 3, 1, 2};
  specrt::NgramIndex index(1, 2);
  index.extend(wide.data(), wide.size());
  CHECK(index.propose(2) == (Tokens{3, 1}));
  CHECK(specrt::propose(wide.data(), wide.size(), 2, 1, 2) == (Tokens{3, 1}));
}

void test_validation() {
  const std::string range = "token ids must be integers in [0, 2147483647], got ";
  CHECK(throws_invalid([] { specrt::NgramIndex(0, 2); }, "min_n must be >= 1, got 0"));
  CHECK(throws_invalid([] { specrt::NgramIndex(3, 2); },
                       "min_n must be <= max_n, got min_n=3, max_n=2"));
  specrt::NgramIndex index(1, 2);
  CHECK(throws_invalid([&] { index.propose(0); }, "k must be >= 1, got 0"));
  const Tokens negative = {1, 2, -5};
  CHECK(throws_invalid([&] { index.extend(negative); }, range + "-5 at index 2"));
  CHECK(index.size() == 0);  // a rejected extend appends nothing
  const std::vector<int64_t> too_big = {1, int64_t{1} << 31};
  CHECK(throws_invalid([&] { index.extend(too_big.data(), too_big.size()); },
                       range + "2147483648 at index 1"));
  CHECK(throws_invalid([&] { specrt::propose(negative.data(), 3, 1, 1, 1); },
                       range + "-5 at index 2"));
  CHECK(throws_invalid([&] { specrt::propose(negative.data(), 3, 1, 2, 1); },
                       "min_n must be <= max_n, got min_n=2, max_n=1"));
}

void test_agreement() {
  // "2 3 4 1" copied after a 9: the 2-gram (4, 1) matches, and the copy agrees for 4 tokens.
  specrt::NgramIndex index(1, 2);
  index.extend(Tokens{5, 2, 3, 4, 1, 7, 9, 2, 3, 4, 1});
  CHECK(index.match_length() == 2 && index.propose(1) == (Tokens{7}));
  CHECK(index.agreement(10) == 4 && index.agreement(3) == 3 && index.agreement(0) == 0);
  index.extend(Tokens{8});  // no earlier 8: nothing matches
  CHECK(index.agreement(10) == 0);
}

}  // namespace

int main() {
  test_hand_written();
  test_index_matches_scan();
  test_int64_input();
  test_agreement();
  test_validation();
  if (failures != 0) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return EXIT_FAILURE;
  }
  std::printf("test_ngram: all checks passed\n");
  return EXIT_SUCCESS;
}
