"""An explicit list of bad inputs (issue 18's families that concern arguments, CLIs and state
files), each with the words its error must contain. `tests/test_fuzz_args.py::test_probe` runs
them all and counts the outcomes: clear SpecrtError / raw traceback / silently accepted / hang.

A case is (family, call, expected substring of the message). Calls:
  "llm"      LLM(TINY, max_seq_len=64, **kwargs)           kwargs: dict
  "generate" llm.generate(prompt, **kwargs)                (prompt, kwargs)
  "stream"   list(llm.stream(prompt, **kwargs))            (prompt, kwargs)
  "spec"     llm.generate([1, 2], speculative=value)       value
  "cli"      specrt.api.cli.main(["--model", TINY, ...])   argv tail (exit 2, one error line)
  "models"   specrt.hub.cli.main(argv)                     argv (exit 2, one error line)
  "cache"    cache_dir() with SPECRT_CACHE set             env value ("FILE": an existing file)
  "calib"    SPECRT_CALIBRATION set to a path              env value ("DIR": a directory)
TINY is the tiny test model's directory, filled in by the runner.
"""
INF, NAN = float("inf"), float("nan")
HUGE = 10**30

LLM_CASES = [
    ({"model": 123}, "model must be"), ({"model": b"dir"}, "model must be"),
    ({"model": ""}, "model must be"), ({"model": "   "}, "model must be"),
    ({"model": ["a"]}, "model must be"), ({"model": "a\0b"}, "model must be"),
    ({"draft": 5}, "draft must be"), ({"draft": ""}, "draft must be"),
    ({"draft": 1.5}, "draft must be"), ({"draft": {"x": 1}}, "draft must be"),
    ({"dtype": "int8"}, "dtype 'int8' is not"), ({"dtype": None}, "dtype None is not"),
    ({"dtype": 32}, "dtype 32 is not"), ({"dtype": ["float32"]}, "is not supported; choose"),
    ({"dtype": "fp32"}, "dtype 'fp32' is not"), ({"dtype": "torch.int64"}, "is not supported"),
    ({"device": "meta"}, "not supported"), ({"device": "tpu:0"}, "device"),
    ({"device": 0}, "device must be"), ({"device": ""}, "device"),
    ({"device": "cuda"}, "CUDA"), ({"device": "cuda:7"}, "CUDA"),
    ({"device": "cpu:x"}, "device"), ({"device": ["cpu"]}, "device must be"),
    ({"device": b"cpu"}, "device must be"), ({"device": "mps"}, "not supported"),
    ({"device": "cpu:5"}, "the CPU is one device and has no index"),
    ({"max_seq_len": -5}, "max_seq_len"), ({"max_seq_len": "4096"}, "max_seq_len"),
    ({"max_seq_len": 1e12}, "max_seq_len"), ({"max_seq_len": 10**12}, "max_seq_len"),
    ({"max_seq_len": True}, "max_seq_len"), ({"max_seq_len": 0}, "max_seq_len"),
    ({"max_seq_len": 1}, "max_seq_len"), ({"max_seq_len": None}, "max_seq_len"),
    ({"max_seq_len": 64.0}, "max_seq_len"), ({"max_seq_len": NAN}, "max_seq_len"),
    ({"max_batch_size": 1e9}, "max_batch_size"), ({"max_batch_size": 0}, "max_batch_size"),
    ({"max_batch_size": -1}, "max_batch_size"), ({"max_batch_size": 10**9}, "max_batch_size"),
    ({"max_batch_size": False}, "max_batch_size"), ({"max_batch_size": "4"}, "max_batch_size"),
    ({"max_queue": -1}, "max_queue"), ({"max_queue": 2**40}, "max_queue"),
    ({"max_queue": None}, "max_queue"), ({"max_queue": 1.5}, "max_queue"),
    ({"cuda_graphs": "yes"}, "cuda_graphs"), ({"cuda_graphs": 1}, "cuda_graphs"),
    ({"max_queue": "8"}, "max_queue"),
    ({"max_queue": 0}, "max_queue"),            # a queue of none would refuse every request
    ({"draft_stop": 1.5}, "draft_stop"), ({"draft_stop": -0.1}, "draft_stop"),
    ({"draft_stop": NAN}, "draft_stop"), ({"draft_stop": "0.5"}, "draft_stop"),
    ({"draft_stop": None}, "draft_stop"), ({"draft_stop": True}, "draft_stop"),
    ({"model": "~specrt-no-such-user/m"}, "names no home directory"),
    ({"max_seqlen": 64}, "did you mean 'max_seq_len'"),
    ({"speculative": {"method": "ngram"}}, "unknown argument 'speculative'"),
]

GENERATE_CASES = [
    ((None, {}), "prompt must be"), ((5, {}), "prompt must be"),
    ((b"def add", {}), "prompt must be"), ((3.5, {}), "prompt must be"),
    (({"a": 1}, {}), "prompt must be"), (("", {}), "prompt is empty"),
    (([], {}), "prompt is empty"), (([1, None], {}), "list of ints"),
    (([1, True], {}), "list of ints"), (([1, 2.0], {}), "list of ints"),
    (([1, -1], {}), "outside the model's vocabulary"), (([10**40], {}), "outside"),
    (([[1], [None]], {}), "list of ints"), (([[1], []], {}), "prompt is empty"),
    ((["ok", 5], {}), "prompt must be"), (("\ud800", {}), "not valid Unicode"),
    (([1, 2], {"max_new_tokens": 0}), "max_new_tokens"),
    (([1, 2], {"max_new_tokens": -3}), "max_new_tokens"),
    (([1, 2], {"max_new_tokens": True}), "max_new_tokens"),
    (([1, 2], {"max_new_tokens": 2.0}), "max_new_tokens"),
    (([1, 2], {"max_new_tokens": "8"}), "max_new_tokens"),
    (([1, 2], {"max_new_tokens": None}), "max_new_tokens"),
    (([1, 2], {"max_new_tokens": 10**30}), "max_new_tokens"),
    (([1, 2], {"max_new_tokens": 100}), "exceeds max_seq_len"),
    (([1, 2], {"temperature": "hot"}), "temperature"),
    (([1, 2], {"temperature": None}), "temperature"),
    (([1, 2], {"temperature": INF}), "temperature"),
    (([1, 2], {"temperature": NAN}), "temperature"),
    (([1, 2], {"temperature": -0.1}), "temperature"),
    (([1, 2], {"temperature": True}), "temperature"),
    (([1, 2], {"temperature": 10**400}), "temperature"),
    (([1, 2], {"temperature": 1e39}), "temperature"),
    (([1, 2], {"temperature": [1.0]}), "temperature"),
    (([1, 2], {"temperature": 1j}), "temperature"),
    (([1, 2], {"top_k": True}), "top_k"), (([1, 2], {"top_k": -2}), "top_k"),
    (([1, 2], {"top_k": 2.5}), "top_k"), (([1, 2], {"top_k": "5"}), "top_k"),
    (([1, 2], {"top_k": None}), "top_k"), (([1, 2], {"top_k": 2**64}), "top_k"),
    (([1, 2], {"top_p": 0}), "top_p"), (([1, 2], {"top_p": 1.5}), "top_p"),
    (([1, 2], {"top_p": NAN}), "top_p"), (([1, 2], {"top_p": INF}), "top_p"),
    (([1, 2], {"top_p": True}), "top_p"), (([1, 2], {"top_p": "0.9"}), "top_p"),
    (([1, 2], {"top_p": None}), "top_p"), (([1, 2], {"top_p": -0.5}), "top_p"),
    (([1, 2], {"seed": 2**64}), "seed"), (([1, 2], {"seed": 2**63}), "seed"),
    (([1, 2], {"seed": -1}), "seed"), (([1, 2], {"seed": 1.5}), "seed"),
    (([1, 2], {"seed": "42"}), "seed"), (([1, 2], {"seed": True}), "seed"),
    (([1, 2], {"seed": HUGE}), "seed"), (([1, 2], {"seed": 10**5000}), "seed"),
    (([1, 2], {"stop": ""}), "non-empty string"), (([1, 2], {"stop": [""]}), "non-empty"),
    (([1, 2], {"stop": [None]}), "non-empty"), (([1, 2], {"stop": 123}), "stop must be"),
    (([1, 2], {"stop": b"x"}), "stop must be"), (([1, 2], {"stop": ["a", 5]}), "non-empty"),
    (([1, 2], {"stop": {"a"}}), "stop must be"), (([1, 2], {"stop": [["a"]]}), "non-empty"),
    (([1, 2], {"stop": "\udcff"}), "not valid Unicode"),
    (([1, 2], {"stop": ["s"] * 257}), "at most 256 stop strings"),
    (([1, 2], {"chat": "yes"}), "chat must be"), (([1, 2], {"chat": 1}), "chat must be"),
    (([1, 2], {"chat": [True]}), "chat must be"),
    (([1, 2], {"temprature": 0.5}), "did you mean 'temperature'"),
    (([1, 2], {"max_tokens": 5}), "did you mean 'max_new_tokens'"),
    (([1, 2], {"bogus": 1}), "unknown argument"),
    ((None, {"messages": []}), "messages must be"),
    ((None, {"messages": "hi"}), "messages must be"),
    ((None, {"messages": [{"role": "user"}]}), "message 0"),
    ((None, {"messages": [{"role": "robot", "content": "x"}]}), "message 0"),
    ((None, {"messages": [{"role": "user", "content": 5}]}), "message 0"),
    ((None, {"messages": [None]}), "message 0"),
    ((None, {"messages": [{"role": "user", "content": "\ud800"}]}), "not valid Unicode"),
    (("hi", {"messages": [{"role": "user", "content": "x"}]}), "not both"),
    (([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]], {}),
     "pass them as messages="),
]

STREAM_CASES = [
    (([[1], [2]], {}), "stream takes one prompt"), ((None, {}), "prompt must be"),
    (([1, 2], {"seed": 2**64}), "seed"), (([1, 2], {"stop": ""}), "non-empty"),
    (([1, 2], {"temperature": NAN}), "temperature"), (([1, 2], {"top_k": True}), "top_k"),
    (([1, 2], {"max_new_tokens": True}), "max_new_tokens"), ((b"x", {}), "prompt must be"),
]

SPEC_CASES = [
    ({"method": "ngram", "model": "some-draft"}, "method 'ngram' drafts from the prompt"),
    ({"model": 5}, 'speculative "model"'), ({"model": ""}, 'speculative "model"'),
    ({"model": ["x"]}, 'speculative "model"'), ({"method": "medusa"}, "is not known"),
    ({"method": None}, "is not known"), ({"method": ["ngram"]}, "is not known"),
    ({"method": 3}, "is not known"), ({"method": "NGRAM"}, "is not known"),
    ({"method": "ngram", "prompt_lookup_max": 2**40}, "prompt_lookup_max"),
    ({"method": "ngram", "prompt_lookup_min": 0}, "prompt_lookup_min"),
    ({"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup_min <="),
    ({"method": "ngram", "prompt_lookup_min": True}, "prompt_lookup_min"),
    ({"method": "ngram", "prompt_lookup_min": 1.5}, "prompt_lookup_min"),
    ({"method": "ngram", "prompt_lookup_max": "3"}, "prompt_lookup_max"),
    ({"method": "ngram", "prompt_lookup_max": None}, "prompt_lookup_max"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 17}, "num_speculative_tokens"),
    ({"method": "draft_model", "prompt_lookup_max": 5}, "does not run"),
    ({"prompt_lookup_min": 2}, "method 'draft_model' does not run"),
    ({"method": "ngram", "num_speculative_tokens": True}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 4.0}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": "4"}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": -1}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2**64}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": NAN}, "num_speculative_tokens"),
    ({"method": "ngram", "k": 4}, "unknown speculative config key"),
    ({1: 2}, "unknown speculative config key"), ({None: 1}, "unknown speculative config key"),
    ("{", "not valid JSON"), ("[" * 50000, "not valid JSON"), ("", "not valid JSON"),
    ('{"num_speculative_tokens": ' + "9" * 5000 + "}", "not valid JSON"),  # > 4300 digits
    ('"ngram"', "must be a JSON object"), ("[]", "must be a JSON object"),
    ("5", "must be a JSON object"), (5, "must be a JSON object"),
    (b'{"method": "ngram"}', "must be a JSON object"), (["ngram"], "must be a JSON object"),
    ('{"method": "ngram", "num_speculative_tokens": NaN}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": 1e400}', "num_speculative_tokens"),
    ({"method": "draft_model"}, "needs a draft model"),
    ({"method": "draft_model", "model": "/nonexistent/draft"}, "does not exist"),
]

CLI_CASES = [
    (["--draft-stop", "0.9"], "--draft-stop sets up a draft model, and none is loaded"),
    (["--draft-dtype", "int4"], "--draft-dtype sets up a draft model, and none is loaded"),
    (["--speculative-config", '{"method": "draft_model", "model": "/nonexistent-draft"}'],
     '--speculative-config "model": model directory /nonexistent-draft does not exist'),
    (["--draft-dtype", "float16"], "error: --draft-dtype: draft_dtype 'float16' is not"),
    (["--device", "cpu:x"], "error: --device: device 'cpu:x' is not a device name"),
    (["--device", "cpu:1"], "error: --device: device 'cpu:1': the CPU is one device"),
    (["--seed", "18446744073709551616"], "seed"), (["--seed", "-1"], "seed"),
    (["--seed", "x"], "invalid int value"), (["--seed", "1.5"], "invalid int value"),
    (["--temperature", "nan"], "temperature"), (["--temperature", "inf"], "temperature"),
    (["--temperature", "-1"], "temperature"), (["--temperature", "hot"], "invalid float"),
    (["--top-k", "-1"], "top_k"), (["--top-k", "1e3"], "invalid int value"),
    (["--top-p", "0"], "top_p"), (["--top-p", "1.01"], "top_p"), (["--top-p", "nan"], "top_p"),
    (["--max-new-tokens", "0"], "max_new_tokens"), (["--max-new-tokens", "-5"], "max_new_tokens"),
    (["--max-new-tokens", "ten"], "invalid int value"),
    (["--max-seq-len", "-5"], "max_seq_len"), (["--max-seq-len", "1e12"], "invalid int value"),
    (["--max-seq-len", "4096.0"], "invalid int value"),
    (["--max-seq-len", "10000000000000"], "max_seq_len"),
    (["--max-seq-len", "8", "--prompt-ids", "1,2,3"], "exceeds max_seq_len"),
    (["--device", "meta"], "not supported"), (["--device", "cuda"], "CUDA"),
    (["--device", "tpu"], "device"), (["--device", ""], "device"),
    (["--dtype", "int8"], "invalid choice"), (["--dtype", ""], "invalid choice"),
    (["--stop", ""], "non-empty"), (["--stop", "a", "--stop", ""], "non-empty"),
    (["--prompt-file", "/dev/zero"], "is a device, not a file"),
    (["--prompt-ids", "1,x"], "comma-separated integers"), (["--prompt-ids", ","], "no ids"),
    (["--prompt-ids", "1,,2"], "empty item"), (["--prompt-ids", ",1"], "empty item"),
    (["--prompt-ids", "1,2,"], "empty item"),
    (["--prompt-ids", "1_0"], "comma-separated integers"),
    (["--prompt-ids", "\u0661,2"], "comma-separated integers"),
    (["--system", "\udcff"], "--system is not valid Unicode"),
    (["--draft", "DRAFTDIR", "--speculative-config", '{"method": "ngram"}'],
     "method 'ngram' drafts from the prompt with none"),
    (["--prompt-ids", ""], "no ids"), (["--prompt-ids", "1,-2"], "token id"),
    (["--prompt-ids", "99999999999999999999"], "token id"),
    (["--prompt-ids", "1,100000"], "outside the model's vocabulary"),
    (["--prompt-ids", "1", "--prompt", "x"], "not both"), (["--prompt", ""], "empty"),
    (["--speculative-config", "{"], "not valid JSON"),
    (["--speculative-config", '{"method": "medusa"}'], "draft_model, ngram, auto"),
    (["--speculative-config", '{"num_speculative_tokens": 0}'], "num_speculative_tokens"),
    (["--speculative-config", '{"model": 5}'], 'speculative "model"'),
    (["--speculative-config", '{"method": "ngram", "prompt_lookup_max": 1099511627776}'],
     "prompt_lookup_max"),
    (["--speculative-config", '{"method": "ngram", "k": 4}'], "unknown speculative config key"),
    (["--speculative-config", "[1]"], "must be a JSON object"),
    (["--speculative-config", '{"method": "draft_model"}', "--prompt-ids", "1"],
     "needs a draft model"),
    (["--draft", ""], "draft must be"), (["--draft", "/nonexistent/d"], "does not exist"),
    (["--top-p", "-0.5"], "top_p"),
    (["--bogus"], "unrecognized arguments"), (["--max-new-tokens"], "expected one argument"),
    (["positional"], "unrecognized arguments"),
]

MODELS_CASES = [
    (["fetch", "qwen-9000"], "unknown model 'qwen-9000'"), (["path", "nope"], "unknown model"),
    (["path"], "the following arguments are required"), ([], "the following arguments"),
    (["frobnicate"], "invalid choice"), (["list", "--bogus"], "unrecognized arguments"),
    (["convert", "x.gguf", ""], "an empty path"), (["convert", "", "out"], "an empty path"),
    (["path", ""], "unknown model"), (["fetch", "--quiet", "x", "y"], "unknown model 'x'"),
]

CACHE_CASES = [("FILE", "is a file, not a directory"), ("FILE/sub", "is a file"),
               ("FILE/a/b", "is a file"), ("~specrt-no-such-user/c", "names no home directory")]
CALIB_CASES = [("DIR", "is a directory"), ("CACHEFILE", "is a file, not a directory"),
               ("~specrt-no-such-user/c.json", "names no home directory")]

CASES = ([("llm", a, m) for a, m in LLM_CASES] + [("generate", a, m) for a, m in GENERATE_CASES]
         + [("stream", a, m) for a, m in STREAM_CASES] + [("spec", a, m) for a, m in SPEC_CASES]
         + [("cli", a, m) for a, m in CLI_CASES] + [("models", a, m) for a, m in MODELS_CASES]
         + [("cache", a, m) for a, m in CACHE_CASES] + [("calib", a, m) for a, m in CALIB_CASES])
