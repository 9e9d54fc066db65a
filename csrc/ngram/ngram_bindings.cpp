// Python bindings for the n-gram matcher (module specrt._ngram). Bindings only: the
// algorithm lives in ngram.cpp. This file's job is to turn Python token containers into
// validated int32/int64 spans without running Python code per token, and to raise the same
// ValueError messages as the pure-Python fallback in specrt/spec/drafters/ngram_index.py.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../build_id.h"
#include "ngram.h"

namespace py = pybind11;

namespace {

constexpr auto kContiguous = py::array::c_style | py::array::forcecast;

std::string token_range() {
  return "token ids must be integers in [0, " + std::to_string(specrt::kMaxToken) + "]";
}

std::string type_name(py::handle obj) {
  return py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>();
}

// Tokens from a Python object as one contiguous span, viewing the caller's buffer when it
// already is contiguous int32/int64 (numpy arrays, CPU torch tensors) and copying otherwise.
// Arrays are range-checked by the core, which does that for every caller.
class TokenSpan {
 public:
  explicit TokenSpan(py::handle obj) {
    if (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr())) {
      from_sequence(obj);
    } else {
      from_array(obj);
    }
  }

  template <typename Fn>
  auto visit(Fn&& fn) const {
    return i32_ != nullptr ? fn(i32_, size_) : fn(i64_, size_);
  }

 private:
  void from_sequence(py::handle seq) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
    PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
    owned_.resize(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      // Owned: a converted item's __index__ runs Python code, which may change the list.
      py::object item = py::reinterpret_borrow<py::object>(items[i]);
      // bool is an int subclass, but True as a token id is almost surely a bug upstream.
      if (PyBool_Check(item.ptr())) throw bad_element(item, i);
      py::object index;
      if (PyLong_CheckExact(item.ptr())) {
        index = py::reinterpret_borrow<py::object>(item);
      } else {
        // Accept whatever operator.index accepts (numpy integer scalars), reject floats.
        PyObject* converted = PyNumber_Index(item.ptr());
        if (converted == nullptr) {
          PyErr_Clear();
          throw bad_element(item, i);
        }
        index = py::reinterpret_steal<py::object>(converted);
        if (PySequence_Fast_GET_SIZE(seq.ptr()) != n) {
          throw py::value_error("the token id list changed size while it was read (at index " +
                                std::to_string(i) + ")");
        }
        items = PySequence_Fast_ITEMS(seq.ptr());   // a list may have moved its items
      }
      // Range-checked here, not only in the core, so that errors come in sequence order
      // whatever their kind, as in the Python fallback.
      int overflow = 0;
      const long long value = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
      if (overflow != 0 || value < 0 || value > specrt::kMaxToken) {
        throw py::value_error(token_range() + ", got " + py::str(index).cast<std::string>() +
                              " at index " + std::to_string(i));
      }
      owned_[static_cast<size_t>(i)] = value;
    }
    i64_ = owned_.data();
    size_ = owned_.size();
  }

  void from_array(py::handle obj) {
    py::array arr = py::isinstance<py::array>(obj)
                        ? py::reinterpret_borrow<py::array>(obj)
                        : py::array(py::module_::import("numpy").attr("asarray")(obj));
    if (arr.ndim() != 1) {
      throw py::value_error("tokens must be a list, tuple or 1-D array of token ids, got a " +
                            std::to_string(arr.ndim()) + "-D " + type_name(obj));
    }
    const char kind = arr.dtype().kind();
    if (kind != 'i' && kind != 'u') {
      throw py::value_error(token_range() + ", got an array of dtype " +
                            py::str(arr.dtype()).cast<std::string>());
    }
    if (kind == 'i' && arr.itemsize() == 4) {
      auto a = py::array_t<int32_t, kContiguous>::ensure(arr);
      i32_ = a.data();
      size_ = static_cast<size_t>(a.size());
      keepalive_ = std::move(a);
    } else if (kind == 'u' && arr.itemsize() == 8) {
      // The one integer dtype that does not fit int64: check before narrowing.
      auto a = py::array_t<uint64_t, kContiguous>::ensure(arr);
      owned_.resize(static_cast<size_t>(a.size()));
      for (size_t i = 0; i < owned_.size(); ++i) {
        const uint64_t v = a.data()[i];
        if (v > static_cast<uint64_t>(specrt::kMaxToken)) {
          throw py::value_error(token_range() + ", got " + std::to_string(v) + " at index " +
                                std::to_string(i));
        }
        owned_[i] = static_cast<int64_t>(v);
      }
      i64_ = owned_.data();
      size_ = owned_.size();
    } else {
      // int64 is viewed in place; narrower integer dtypes are widened (a copy).
      auto a = py::array_t<int64_t, kContiguous>::ensure(arr);
      i64_ = a.data();
      size_ = static_cast<size_t>(a.size());
      keepalive_ = std::move(a);
    }
  }

  static py::value_error bad_element(py::handle item, Py_ssize_t i) {
    return py::value_error(token_range() + ", got " + py::repr(item).cast<std::string>() +
                           " of type " + type_name(item) + " at index " + std::to_string(i));
  }

  const int32_t* i32_ = nullptr;
  const int64_t* i64_ = nullptr;
  size_t size_ = 0;
  std::vector<int64_t> owned_;
  py::object keepalive_;
};

// An integer argument as the Python backend reads it (operator.index: ints, numpy integers,
// bool; a float is a TypeError), saturated to int64: a value past int64 then passes or fails
// the same range check as the Python backend's exact int, its message showing the bound it was
// read as (pybind11's own int64_t conversion refused it with a TypeError naming no argument).
int64_t index_arg(py::handle value) {
  PyObject* index = PyNumber_Index(value.ptr());
  if (index == nullptr) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
  Py_DECREF(index);
  if (overflow != 0) return overflow > 0 ? INT64_MAX : INT64_MIN;
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

py::list to_list(const specrt::Token* data, size_t count) {
  py::list out(count);
  for (size_t i = 0; i < count; ++i) {
    PyObject* value = PyLong_FromLong(data[i]);
    if (value == nullptr) throw py::error_already_set();
    PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), value);
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_ngram, m) {
  m.doc() =
      "Prompt-lookup n-gram matcher (C++ backend of specrt.drafters.ngram_index).\n\n"
      "Token ids may be given as a list or tuple of ints, or a 1-D integer array (numpy,\n"
      "CPU torch tensor, anything numpy.asarray accepts); they must lie in [0, 2**31 - 1].\n"
      "Drafts come back as lists of int.";

  py::class_<specrt::NgramIndex>(m, "NgramIndex", R"doc(
Incremental prompt-lookup index over a growing token history.

NgramIndex(min_n, max_n): for each n-gram length in [min_n, max_n] the index keeps the
most recent earlier occurrence of the history's last n tokens, so propose(k) costs
O(max_n + k) whatever the history length. Raises ValueError unless
1 <= min_n <= max_n <= 1024.
)doc")
      .def(py::init([](py::handle min_n, py::handle max_n) {
             return new specrt::NgramIndex(index_arg(min_n), index_arg(max_n));
           }),
           py::arg("min_n"), py::arg("max_n"))
      .def(
          "extend",
          [](specrt::NgramIndex& self, py::handle tokens) {
            TokenSpan(tokens).visit([&](const auto* data, size_t n) { self.extend(data, n); });
          },
          py::arg("tokens"),
          "Append committed tokens (list/tuple of ints or 1-D integer array). Raises\n"
          "ValueError, leaving the index unchanged, if any token is not an integer in\n"
          "[0, 2**31 - 1].")
      .def(
          "propose",
          [](const specrt::NgramIndex& self, py::handle k) {
            const auto [begin, end] = self.propose_range(index_arg(k));
            return to_list(self.tokens().data() + begin, end - begin);
          },
          py::arg("k"),
          "Draft of up to k tokens: what followed the most recent earlier occurrence of the\n"
          "longest matching suffix n-gram (n from max_n down to min_n); [] if none matches.\n"
          "Raises ValueError if k < 1.")
      .def("match_length", &specrt::NgramIndex::match_length,
           "The suffix length n that propose matches on (the longest n in [min_n, max_n] whose\n"
           "last n tokens occurred earlier); 0 if none does.")
      .def("agreement",
           [](const specrt::NgramIndex& self, py::handle limit) {
             return self.agreement(index_arg(limit));
           },
           py::arg("limit"),
           "How many tokens, up to limit, the history's suffix shares with the text ending\n"
           "where propose copies from: match_length() below max_n, possibly more once the\n"
           "whole max_n-gram matches; 0 if nothing matches (or limit <= 0).")
      .def("reset", &specrt::NgramIndex::reset, "Forget the whole history (and free its memory).")
      .def("__len__", &specrt::NgramIndex::size, "Number of tokens in the history.")
      .def_property_readonly("min_n", &specrt::NgramIndex::min_n)
      .def_property_readonly("max_n", &specrt::NgramIndex::max_n)
      .def("__repr__", [](const specrt::NgramIndex& self) {
        return "NgramIndex(min_n=" + std::to_string(self.min_n()) +
               ", max_n=" + std::to_string(self.max_n()) + ", len=" + std::to_string(self.size()) +
               ")";
      });

  m.def(
      "propose",
      [](py::handle history, py::handle k_arg, py::handle min_arg, py::handle max_arg) {
        // Same check order as the Python fallback: sizes first, then tokens.
        const int64_t k = index_arg(k_arg);
        specrt::check_k(k);
        const int64_t min_n = index_arg(min_arg), max_n = index_arg(max_arg);
        specrt::check_ngram_sizes(min_n, max_n);
        const auto draft = TokenSpan(history).visit([&](const auto* data, size_t n) {
          return specrt::propose(data, n, k, min_n, max_n);
        });
        return to_list(draft.data(), draft.size());
      },
      py::arg("history"), py::arg("k"), py::arg("min_n"), py::arg("max_n"),
      "Stateless matcher: the draft NgramIndex(min_n, max_n) would propose after extend(history),\n"
      "found by a direct backward scan (O(len(history) * max_n)). For one-off calls; use\n"
      "NgramIndex in a decoding loop.");
  m.def("build_id", [] { return SPECRT_BUILD_ID; },
        "Hash of the sources and flags this module was built from");
}
