"""`python app.py`: bad input ends with one line on stderr and exit status 2 (no server started)."""

from __future__ import annotations

import app


def test_missing_model_is_one_line_and_status_2(tmp_path, capsys):
    assert app.main(["--model", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model folder not found") and "--no-model" in err[0]


def test_bad_numbers_are_refused(capsys):
    assert app.main(["--fps", "0"]) == 2
    assert app.main(["--threads", "0"]) == 2
    assert capsys.readouterr().err.count("\n") == 2


def test_unknown_flag_is_one_line(capsys):
    try:
        app.main(["--nonsense"])
    except SystemExit as exc:
        assert exc.code == 2
    assert capsys.readouterr().err.strip().startswith("error: unrecognized arguments")
