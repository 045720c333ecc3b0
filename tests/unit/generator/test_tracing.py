"""The trace options of ``generator serve``: settings, and the tritonserver flags they become.

What Triton does with the flags is checked on the real server in
tests/integration/test_traces.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from generator.cli import _parser
from generator.tracing import TraceConfigError, TraceSettings
from generator.triton_local import TritonLaunch, server_command

URL = "http://otel-collector:4318/v1/traces"


def _resolve(argv: list[str], env: dict[str, str]) -> TraceSettings | None:
    args = _parser().parse_args(["serve", *argv])
    return TraceSettings.resolve(
        args.trace_endpoint, args.trace_rate, args.trace_resource, args.trace_export_delay_ms,
        env=env,
    )


def test_tracing_is_off_without_an_endpoint() -> None:
    assert _resolve([], {}) is None
    assert _resolve([], {"EMBED_TRACE_ENDPOINT": "  "}) is None
    # what the deployments set while tracing is off: checked, then unused
    env = {"EMBED_TRACE_RATE": "1000", "EMBED_TRACE_RESOURCE": "service.name=triton-embeddings"}
    assert _resolve([], env) is None


def test_settings_come_from_the_environment() -> None:
    env = {
        "EMBED_TRACE_ENDPOINT": URL,
        "EMBED_TRACE_RATE": "10",
        "EMBED_TRACE_RESOURCE": "service.name=emb, k8s.pod.name=pod-1,",
        "EMBED_TRACE_EXPORT_DELAY_MS": "250",
    }
    assert _resolve([], env) == TraceSettings(
        URL, 10, (("service.name", "emb"), ("k8s.pod.name", "pod-1")), 250
    )


def test_options_win_over_the_environment_and_resources_repeat() -> None:
    env = {"EMBED_TRACE_ENDPOINT": "http://elsewhere/v1/traces", "EMBED_TRACE_RATE": "10",
           "EMBED_TRACE_RESOURCE": "service.name=from-env"}
    argv = ["--trace-endpoint", URL, "--trace-rate", "0",
            "--trace-resource", "service.name=emb", "--trace-resource", "deployment.environment=x"]
    assert _resolve(argv, env) == TraceSettings(
        URL, 0, (("service.name", "emb"), ("deployment.environment", "x"))
    )


def test_defaults_are_tritons_rate_and_no_resource() -> None:
    assert _resolve(["--trace-endpoint", URL], {}) == TraceSettings(URL, 1000, (), None)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--trace-endpoint", "otel-collector:4318"], {}, "must be an http"),
        (["--trace-endpoint", "grpc://otel:4317"], {}, "must be an http"),
        (["--trace-endpoint", "http://otel:4318/v1 traces"], {}, "whitespace"),
        (["--trace-rate", "-1"], {}, "0 or more"),
        ([], {"EMBED_TRACE_RATE": "often"}, "EMBED_TRACE_RATE='often' is not a whole number"),
        ([], {"EMBED_TRACE_RATE": "-5"}, "must be at least 0"),
        ([], {"EMBED_TRACE_RESOURCE": "service.name"}, "not key=value"),
        ([], {"EMBED_TRACE_RESOURCE": "=x"}, "not key=value"),
        (["--trace-resource", "a=b,c=d"], {}, "--trace-resource"),
        (["--trace-export-delay-ms", "0"], {}, ">= 1"),
        ([], {"EMBED_TRACE_EXPORT_DELAY_MS": "soon"}, "not a whole number"),
    ],
)
def test_bad_settings_fail_at_start_even_with_tracing_off(argv, env, message) -> None:
    with pytest.raises(TraceConfigError, match=message):
        _resolve(argv, env)


def test_trace_settings_are_a_value_error_the_cli_reports() -> None:
    assert issubclass(TraceConfigError, ValueError)  # main() prints it and exits 2


def test_flags_turn_on_opentelemetry_with_timestamps_for_every_count() -> None:
    settings = TraceSettings(URL, 5, (("service.name", "emb"), ("team", "a=b")), 200)
    assert settings.args() == [
        "--trace-config=mode=opentelemetry",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=5",
        "--trace-config=count=-1",
        f"--trace-config=opentelemetry,url={URL}",
        "--trace-config=opentelemetry,resource=service.name=emb",
        "--trace-config=opentelemetry,resource=team=a=b",
        "--trace-config=opentelemetry,bsp_schedule_delay=200",
    ]
    assert "bsp_schedule_delay" not in " ".join(TraceSettings(URL).args())


def test_server_command_carries_the_trace_flags_only_when_tracing(tmp_path, monkeypatch) -> None:
    binary = tmp_path / "tritonserver"
    binary.write_text("")
    monkeypatch.setenv("TRITON_SERVER_BIN", str(binary))
    plain = TritonLaunch(Path("/repo"), admin_key="k" * 20)
    traced = TritonLaunch(Path("/repo"), admin_key="k" * 20, trace=TraceSettings(URL, 1),
                          extra_args=("--log-info=true",))
    assert not [a for a in server_command(plain, tmp_path) if a.startswith("--trace")]
    cmd = server_command(traced, tmp_path)
    assert cmd[-1] == "--log-info=true"
    flags = TraceSettings(URL, 1).args()
    assert cmd[-1 - len(flags):-1] == flags


def test_start_message_names_the_collector_without_credentials() -> None:
    settings = TraceSettings("https://user:secret@collector:4318/v1/traces?x=1", 100)
    line = settings.describe()
    assert line == (
        "OTLP/HTTP to https://collector:4318/v1/traces, 1 request in 100 and every one with "
        "a traceparent"
    )
    assert "secret" not in TraceSettings("http://u:secret@c/v1/traces", 0).describe()
    assert TraceSettings(URL, 0).describe().endswith("requests with a traceparent only")
