"""`domo broker` and the nng extra: the help says how to install it, and without it an nng+
endpoint is a usage error that says so (MEMO-21)."""

from __future__ import annotations

import pytest

import domo.cli


def test_help_says_how_to_install_the_extra_when_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(domo.cli._common, "_nng_installed", lambda: False)
    with pytest.raises(SystemExit):
        domo.cli.main(["broker", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "nng+tcp://HOST:PORT" in text
    assert "it needs the nng extra, pip install 'domo[nng]' (not installed here)" in text


def test_an_nng_endpoint_without_the_extra_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(domo.cli._common, "_nng_installed", lambda: False)
    with pytest.raises(SystemExit) as exited:
        domo.cli.main(["broker", "--bind", "nng+tcp://127.0.0.1:0"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "nng+tcp://127.0.0.1:0: memo01 on nng+tcp://" in err
    assert "pip install 'domo[nng]'" in err


def test_serve_broker_without_the_extra_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import builtins

    real_import = builtins.__import__

    def no_pynng(name: str, *args: object, **kwargs: object) -> object:
        if name == "pynng":
            raise ImportError("No module named 'pynng'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_pynng)
    from domo.trio.broker import require_nng

    with pytest.raises(RuntimeError, match=r"pip install 'domo\[nng\]'"):
        require_nng()
