//! The Python client (`clients/python`, package `turnstile-client`) tested by its own suite
//! (`clients/python/tests`, stdlib `unittest`) against real `turnstile dev` processes and nats-servers that
//! the Python harness starts itself, so they count in nextest's summary and `.ci/run` fails when one
//! does. Each test here runs one Python test module with the interpreter of `.ci/venv`
//! (`TURNSTILE_TEST_PYTHON`: grpcio, grpcio-tools, grpcio-reflection, protobuf at the pins of
//! scripts/setup-test-deps), the `turnstile` binary the harness builds or finds, and its nats-server.
//! The client's protobuf modules are generated first (`protogen.py`; nothing happens when they are up to
//! date). docs/decisions/0031-python-client.md.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

use turnstile_tests::binary::{turnstile_bin, workspace_root};
use turnstile_tests::nats::nats_server_bin;

fn python() -> String {
    std::env::var("TURNSTILE_TEST_PYTHON")
        .expect("TURNSTILE_TEST_PYTHON is not set: run scripts/setup-test-deps, then `source .ci/test-env.sh`")
}

fn client_dir() -> PathBuf {
    workspace_root().join("clients/python")
}

/// Runs `python -m unittest -v MODULE` in `clients/python/tests` and fails with its output unless every
/// test of the module passed.
async fn run_module(module: &'static str) {
    let bin = tokio::task::spawn_blocking(turnstile_bin).await.unwrap().unwrap();
    let dir = client_dir();
    let generated = Command::new(python()).arg(dir.join("protogen.py")).output().unwrap();
    assert!(generated.status.success(), "protogen.py failed:\n{}", String::from_utf8_lossy(&generated.stderr));
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .args(["-m", "unittest", "-v", module])
            .current_dir(dir.join("tests"))
            .env("PYTHONPATH", dir.join("src"))
            .env("TURNSTILE_BIN", bin)
            .env("NATS_SERVER_BIN", nats_server_bin())
            .env("PYTHONUNBUFFERED", "1")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "python -m unittest {module} failed ({}):\n{text}", output.status);
    // unittest prints "Ran N tests" and "OK"; a module that ran none would pass vacuously.
    assert!(!text.contains("Ran 0 tests"), "no Python test ran:\n{text}");
    println!("{text}");
}

/// Every RPC helper, retries with the same MessageId after a lost reply, the address provider, the
/// blocking client and decorated tools, on the embedded journal and on `--nats`.
#[tokio::test]
async fn python_client_on_embedded_and_nats() {
    run_module("test_client").await;
}

/// `watch()` resumes from the last seq across a gateway stopped, or killed, and started again on a new
/// port on the same NATS (and on the embedded journal with `--data-dir`).
#[tokio::test]
async fn python_watch_resumes_across_a_restarted_gateway() {
    run_module("test_watch_resume").await;
}

/// `watch()` through a proxy that drops the connection mid-reply reopens the stream with the streaming
/// step's offsets (SPEC §14): the deltas the caller saw are the reply, each byte once, on both journals.
#[tokio::test]
async fn python_watch_resumes_a_streaming_reply_across_a_dropped_connection() {
    run_module("test_stream_resume").await;
}

/// Parity with the TypeScript client (issue 41): every RPC has a method, every public method of the
/// TypeScript `ClientBase` has a Python twin (its twin, `parity.test.mjs`, checks the other way).
#[tokio::test]
async fn python_client_has_every_rpc_and_every_method_of_the_typescript_client() {
    run_module("test_parity").await;
}

/// grpcio-reflection's v1alpha client lists `turnstile.v1.Agent`.
#[tokio::test]
async fn python_grpcio_reflection_v1alpha_lists_the_agent() {
    run_module("test_reflection").await;
}

/// `pip wheel clients/python` (setup.py's build step runs protogen.py) gives a wheel that carries the
/// generated modules: what `pip install ./clients/python` installs. Without build isolation, so it needs no
/// network: the venv has setuptools and grpcio-tools.
#[tokio::test]
async fn python_client_builds_a_wheel_with_its_generated_modules() {
    let out_dir = tempfile::tempdir().unwrap();
    let wheel_dir = out_dir.path().to_owned();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .args([
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "--disable-pip-version-check",
                "-q",
                "-w",
            ])
            .arg(&wheel_dir)
            .arg(client_dir())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(output.status.success(), "pip wheel failed:\n{}", String::from_utf8_lossy(&output.stderr));
    let wheel = std::fs::read_dir(out_dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"));
    let wheel = wheel.expect("a .whl file");
    assert!(wheel.file_name().unwrap().to_string_lossy().starts_with("turnstile_client-0.1.0-py3-none-any"));
    let listing = Command::new(python()).args(["-m", "zipfile", "-l"]).arg(&wheel).output().unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    for module in [
        "turnstile_client/_proto/turnstile/v1/agent_pb2.py",
        "turnstile_client/_proto/turnstile/v1/agent_pb2_grpc.py",
        "turnstile_client/_proto/turnstile/v1/events_pb2.pyi",
        "turnstile_client/_proto/turnstile/hooks/v1/hooks_pb2.py",
        "turnstile_client/_tools.py",
    ] {
        assert!(listing.contains(module), "{module} is not in the wheel:\n{listing}");
    }
    assert!(!listing.contains("cluster"), "the internal cluster API is not part of the client:\n{listing}");
}
