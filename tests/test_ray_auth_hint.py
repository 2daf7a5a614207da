"""What `--engine ray --ray-address` says when the cluster wants a token it was not given.

Ray's ray.init() against a cluster with token authentication, without the token, retries for
about 20 s and raises ConnectionError("Failed to connect to Ray cluster at ...") caused by a
RuntimeError that carries the last attempt's traceback ending in
ray.exceptions.AuthenticationError. Starting such a cluster (`ray start` with a token file) takes
a shared machine's cores for half a minute, so these tests build that exception chain from Ray's
own exception classes and messages and check what semsearch makes of it."""
from __future__ import annotations

import pytest

ray = pytest.importorskip("ray", reason="the Ray engine needs pip install 'semsearch[ray]'")

from semsearch.engines.ray_engine import connect_error  # noqa: E402
from semsearch.errors import InputError  # noqa: E402

LAST_ATTEMPT = ("Failed to connect to GCS. Last connection error: Traceback (most recent call last):\n"
                '  File ".../ray/_private/node.py", line 996, in _init_gcs_client\n'
                "    client = GcsClient(\n"
                "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: Authentication token is missing or incorrect\n")


def ray_init_failure(inner: BaseException) -> ConnectionError:
    """The exception chain ray.init(address=...) raises when it gives up on the cluster."""
    try:
        try:
            raise inner
        except BaseException as e:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379") from e
    except ConnectionError as outer:
        return outer


@pytest.mark.parametrize("inner", [RuntimeError(LAST_ATTEMPT),
                                   ray.exceptions.AuthenticationError("RPC error: InvalidAuthToken: Authentication token is missing or incorrect")],
                         ids=["traceback-text", "exception-class"])
def test_no_token_names_what_to_set(inner, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    err = connect_error("10.0.0.5:6379", ray_init_failure(inner))
    assert isinstance(err, InputError)
    msg = str(err)
    assert "10.0.0.5:6379" in msg and "token authentication" in msg
    assert "RAY_AUTH_MODE=token" in msg and "RAY_AUTH_TOKEN" in msg and "RAY_AUTH_TOKEN_PATH" in msg


def test_wrong_token_with_token_mode_says_the_token_was_refused(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    msg = str(connect_error("10.0.0.5:6379", ray_init_failure(RuntimeError(LAST_ATTEMPT))))
    assert "refused this process's token" in msg and "RAY_AUTH_TOKEN" in msg
    assert "RAY_AUTH_MODE=token" not in msg  # already set: not the advice


def test_other_connection_failures_keep_rays_first_line(monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    inner = RuntimeError("Failed to connect to GCS. Last connection error: RpcError: Timed out while waiting for GCS to become available.")
    msg = str(connect_error("10.0.0.5:6379", ray_init_failure(inner)))
    assert msg == "cannot connect to the Ray cluster at '10.0.0.5:6379': Failed to connect to Ray cluster at 10.0.0.5:6379"
    assert "RAY_AUTH" not in msg
