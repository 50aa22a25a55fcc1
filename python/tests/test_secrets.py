"""No credential reaches Python: canary values in every place credentials
come from (the AWS variables, an AWS profile's files, a URL's userinfo, a
pre-signed URL's query), the API's succeeding and failing calls run with
them against the real servers, and no canary may be in an exception (its
message, repr or traceback), a repr, a summary or the progress output. The
failures are the store's, each with its own message, in our hierarchy."""

from __future__ import annotations

import shutil
import socket
import traceback
from pathlib import Path
from typing import Any

import pytest

import deltacells
from conftest import REPO

EXAMPLE = REPO / "examples" / "pbmc_1k.h5ad"

ENV = {
    "AWS_ACCESS_KEY_ID": "AKIACANARYENV0000001",
    "AWS_SECRET_ACCESS_KEY": "canary-env-secret-0000002",
    "AWS_SESSION_TOKEN": "canary-env-session-0000003",
}
PROFILE = ("AKIACANARYPROFILE004", "canary-profile-secret-05", "canary-profile-token-06")
USER, PASSWORD = "canaryuser07", "canarypass08"
QUERY = (
    "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIACANARYQUERY00009%2F20260101%2Fus-east-1%2Fs3"
    "&X-Amz-Date=20260101T000000Z&X-Amz-Security-Token=canary-query-token-10&X-Amz-Signature=canaryquerysig11"
    "&X-Goog-Signature=canarygoogsig12&sig=canarysig13&token=canarytoken14&key=canarykey15"
)
CANARIES = [
    *ENV.values(), *PROFILE, USER, PASSWORD, "AKIACANARYQUERY00009", "canary-query-token-10", "canaryquerysig11",
    "canarygoogsig12", "canarysig13", "canarytoken14", "canarykey15",
]


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def texts_of(error: BaseException) -> list[str]:
    """What a user sees of an exception: str, repr and the whole traceback
    (with the exceptions it was raised from)."""
    return [str(error), repr(error), "".join(traceback.format_exception(error))]


def assert_clean(texts: list[str]) -> None:
    for text in texts:
        for canary in CANARIES:
            assert canary not in text, f"{canary} in {text!r}"


def use_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The profile's keys, and none in the environment."""
    aws = tmp_path / "aws"
    aws.mkdir()
    (aws / "credentials").write_text(
        f"[canary]\naws_access_key_id = {PROFILE[0]}\naws_secret_access_key = {PROFILE[1]}\n"
        f"aws_session_token = {PROFILE[2]}\n"
    )
    (aws / "config").write_text("[profile canary]\nregion = us-east-1\n")
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_PROFILE", "canary")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(aws / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(aws / "config"))


def test_no_credential_in_exceptions_reprs_summaries_or_progress(
    s3_server: str, http_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    shutil.copy(EXAMPLE, tmp_path / "pbmc_1k.h5ad")
    host = http_server(tmp_path).removeprefix("http://")
    with_userinfo = f"http://{USER}:{PASSWORD}@{host}"
    texts: list[str] = []

    # Succeeding calls: a dataset written to S3 and read with the variables'
    # keys, read with the profile's; one converted from a URL with userinfo
    # and read back through it; with progress bars.
    summary = deltacells.convert([str(EXAMPLE)], "s3://test/ds", tile_size=300, level=3, endpoint=s3_server,
                                 progress=True)
    ds = deltacells.open_dataset("s3://test/ds", endpoint=s3_server, cache_dir=str(tmp_path / "c"))
    texts += [repr(summary), repr(ds), repr(ds.obs), repr(ds.get_batch([0, 1]))]
    local = tmp_path / "from_url"
    summary = deltacells.convert([f"{with_userinfo}/pbmc_1k.h5ad"], str(local), tile_size=300, progress=True)
    texts.append(repr(summary))
    assert "canary" not in (local / "manifest.json").read_text()
    served = deltacells.open_dataset(f"{with_userinfo}/from_url", cache_dir=str(tmp_path / "c"))
    assert f"http://REDACTED@{host}/from_url" in repr(served)
    texts.append(repr(served))
    appended = deltacells.append("s3://test/ds", [f"{with_userinfo}/pbmc_1k.h5ad"], endpoint=s3_server,
                                 progress=True)
    texts.append(repr(appended))
    # the Python layer's own messages go through the same redaction
    made_here = deltacells.DeltacellsError(f"{with_userinfo}/x.h5ad?{QUERY}: the dataset has no obs")
    assert str(made_here).startswith(f"http://REDACTED@{host}/x.h5ad?X-Amz-Algorithm=AWS4-HMAC-SHA256")
    texts += texts_of(made_here)

    # Failing calls: a pre-signed URL the server does not have, a 403, a
    # refused connection, each for an input and for a dataset.
    presigned = f"{with_userinfo}/nothing.h5ad?{QUERY}"
    forbidden = f"{with_userinfo}/forbidden/ds?{QUERY}"
    refused = f"http://{USER}:{PASSWORD}@127.0.0.1:{unused_port()}/ds?{QUERY}"
    failing = [
        (lambda: deltacells.convert([presigned], str(tmp_path / "out1"), progress=True), deltacells.InputNotFoundError),
        (lambda: deltacells.append("s3://test/ds", [presigned], endpoint=s3_server), deltacells.InputNotFoundError),
        (lambda: deltacells.open_dataset(forbidden), deltacells.DeltacellsError),
        (lambda: deltacells.open_dataset(refused), deltacells.DeltacellsError),
    ]
    messages = []
    for call, kind in failing:
        with pytest.raises(kind) as raised:
            call()
        texts += texts_of(raised.value)
        messages.append(str(raised.value))
    assert f"http://REDACTED@{host}/nothing.h5ad?" in messages[0] and "not found (HTTP 404)" in messages[0]
    assert "access denied (HTTP 403)" in messages[2] and "X-Amz-Signature=REDACTED" in messages[2]
    assert "connection refused by 127.0.0.1:" in messages[3]

    use_profile(tmp_path, monkeypatch)
    ds = deltacells.open_dataset("s3://test/ds", endpoint=s3_server, cache_dir=str(tmp_path / "c"))
    texts += [repr(ds), repr(ds.get_batch([0]))]
    with pytest.raises(deltacells.DeltacellsError) as raised:
        deltacells.open_dataset("s3://no-such-bucket/ds", endpoint=f"http://127.0.0.1:{unused_port()}")
    texts += texts_of(raised.value)

    out, err = capfd.readouterr()
    assert "pbmc_1k.h5ad" in err, "the progress bars name the input"
    assert_clean([*texts, out, err])
