"""`generate_ab --calibration FILE`: the pair of curves a calibration file holds is read as
specrt saves it, and any other file is refused with one clear error before a build is made."""
import json

import pytest

from benchmarks import generate_ab

TARGET, DRAFT = "target|cpu|cal8", "draft|cpu|cal8"
PAIR = {f"{TARGET} | beside {DRAFT}": [0.09, 0.095], f"{DRAFT} | beside {TARGET}": [0.013, 0.014]}


@pytest.mark.parametrize("extra", [{}, {"other|cpu|cal8": [0.05, 0.06]}])
def test_the_pair_timed_together_is_read_the_slower_step_the_targets(tmp_path, extra):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({**dict(reversed(PAIR.items())), **extra}))
    assert generate_ab.given_calibration(str(path)) == {"verify": [0.09, 0.095],
                                                         "draft": [0.013, 0.014]}


@pytest.mark.parametrize("text, says", [
    (None, "cannot read it"),                       # no such file
    ("{not json", "cannot read it"),
    ("[0.09, 0.1]", "not a calibration file"),
    ("{}", "not a calibration file"),
    ('{"target": "fast"}', "not a calibration file"),
    ('{"target": []}', "not a calibration file"),
    ('{"target": [0.09, -1]}', "not a calibration file"),
    ('{"target": [0.09, 0.1]}', "holds 0 pairs"),
    (json.dumps({**PAIR, "a | beside b": [0.1], "b | beside a": [0.01]}), "holds 2 pairs"),
    (json.dumps({f"{TARGET} | beside {DRAFT}": [0.09, 0.095],
                 f"{DRAFT} | beside {TARGET}": [0.013]}), "differ in length"),
    ('{"target": [0.1, 0.09]}', "not a calibration file"),      # falling: never saved so
    ('{"target": [true]}', "not a calibration file"),
    ("[" * 100000 + "]" * 100000, "cannot read it"),             # nested past the recursion limit
])
def test_any_other_file_is_refused_with_one_clear_error(tmp_path, capsys, text, says):
    path = tmp_path / "calibration.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as exc:
        generate_ab.given_calibration(str(path))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --calibration ") and says in err and "Traceback" not in err


def test_a_calibration_without_auto_to_plan_from_it_is_refused(tmp_path, capsys):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(PAIR))
    with pytest.raises(SystemExit) as exc:
        generate_ab.main(["--methods", "plain,draft_model:5", "--calibration", str(path)])
    assert exc.value.code == 2
    assert "add an auto:K method" in capsys.readouterr().err
