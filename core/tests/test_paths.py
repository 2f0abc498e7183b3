"""moe_core.paths: where records are written on a user's machine."""

from pathlib import Path

from moe_core.paths import CACHE_VAR, user_dir


def test_user_dir_kind_under_cache_var(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_VAR, str(tmp_path))
    assert user_dir("triton") == tmp_path / "triton"


def test_user_dir_own_variable_wins(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_VAR, str(tmp_path / "all"))
    monkeypatch.setenv("MOE_TEST_KIND_DIR", str(tmp_path / "mine"))
    assert user_dir("kind", "MOE_TEST_KIND_DIR") == tmp_path / "mine"
    monkeypatch.setenv("MOE_TEST_KIND_DIR", "")
    assert user_dir("kind", "MOE_TEST_KIND_DIR") == tmp_path / "all" / "kind"


def test_user_dir_default_is_outside_site_packages(monkeypatch):
    monkeypatch.delenv(CACHE_VAR, raising=False)
    path = user_dir("triton")
    assert path.name == "triton" and path.parent.name == "moe"
    assert "site-packages" not in Path(path).parts
