//! The README's quickstart ("your own model key + the Python client") runs as printed (issue 31).
//!
//! CI has no provider key, so the block's OpenAI endpoint is the one thing replaced: its `base_url` becomes a
//! real llama-server with SmolLM2 on loopback (`tests/src/llama.rs`, OpenAI-compatible, which ignores the
//! key), and the key variable keeps the dummy value the README exports. Everything else runs as written, line
//! by line, in a scratch directory where `./clients` is the checkout's: `turnstile.toml` is written by the
//! README's heredoc, `turnstile dev --config turnstile.toml &` is started by the harness (on port 0, its
//! address handed to the next commands as `TURNSTILE_ADDR`, which the example reads), `pip install
//! ./clients/python` installs into a venv of the test's own (offline, from the packages of
//! `TURNSTILE_TEST_PYTHON`'s environment), and the example prints the model's streamed answer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use turnstile_tests::binary::turnstile_bin;
use turnstile_tests::llama::LlamaServer;
use turnstile_tests::{DevOptions, DevServer};

/// The endpoint the README's configuration names, replaced by the local llama-server's.
const README_ENDPOINT: &str = "https://api.openai.com/v1";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The commands of the first ```sh block under `## Quickstart`, a heredoc joined to its command.
fn quickstart_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = readme.split_once("\n## Quickstart").expect("README.md has a Quickstart section").1;
    let block = section.split_once("```sh\n").unwrap().1.split_once("\n```").unwrap().0;
    let mut commands = Vec::new();
    let mut lines = block.lines();
    while let Some(line) = lines.next() {
        let mut command = line.to_owned();
        if let Some(at) = line.find("<<'") {
            let tag = line[at + 3..].split('\'').next().unwrap().to_owned();
            for body in lines.by_ref() {
                command.push('\n');
                command.push_str(body);
                if body == tag {
                    break;
                }
            }
        }
        commands.push(command);
    }
    commands
}

/// A venv whose `pip` installs offline, with the build tools and dependencies of `TURNSTILE_TEST_PYTHON`'s
/// environment visible to it (a `.pth` file), so `pip install ./clients/python` needs no network.
fn venv(scratch: &Path) -> PathBuf {
    let python = std::env::var("TURNSTILE_TEST_PYTHON")
        .expect("TURNSTILE_TEST_PYTHON is not set: run scripts/setup-test-deps and `source .ci/test-env.sh`");
    let dir = scratch.join("venv");
    let run = |program: &Path, args: &[&str]| {
        let out = std::process::Command::new(program).args(args).output().unwrap();
        assert!(out.status.success(), "{program:?} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])";
    run(Path::new(&python), &["-m", "venv", "--without-pip", dir.to_str().unwrap()]);
    let theirs = run(Path::new(&python), &["-c", purelib]);
    let ours = run(&dir.join("bin/python"), &["-c", purelib]);
    std::fs::write(Path::new(&ours).join("turnstile-test-deps.pth"), format!("{theirs}\n")).unwrap();
    let pip = dir.join("bin/pip");
    std::fs::write(&pip, "#!/bin/sh\nexec \"$(dirname \"$0\")/python\" -m pip \"$@\"\n").unwrap();
    let mut permissions = std::fs::metadata(&pip).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&pip, permissions).unwrap();
    dir
}

#[tokio::test]
async fn the_readme_quickstart_runs_against_a_local_openai_compatible_server() {
    let commands = quickstart_commands();
    assert!(commands.len() <= 20, "the quickstart stays short ({} commands)", commands.len());
    assert!(commands.iter().any(|c| c.contains(README_ENDPOINT)), "the quickstart's model names {README_ENDPOINT}");
    let llama = LlamaServer::start().await.unwrap();
    let bin = tokio::task::spawn_blocking(turnstile_bin).await.unwrap().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(root().join("clients"), scratch.path().join("clients")).unwrap();
    let venv = tokio::task::spawn_blocking({
        let scratch = scratch.path().to_path_buf();
        move || venv(&scratch)
    })
    .await
    .unwrap();
    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            format!(
                "{}:{}:{}",
                venv.join("bin").display(),
                bin.parent().unwrap().display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        ),
        ("NO_COLOR".into(), "1".into()),
        ("PIP_NO_INDEX".into(), "1".into()),
        ("PIP_NO_BUILD_ISOLATION".into(), "0".into()),
        ("PIP_DISABLE_PIP_VERSION_CHECK".into(), "1".into()),
    ];
    let mut server = None;
    let mut last_output = String::new();
    for command in commands {
        let command = command.replace(README_ENDPOINT, &llama.base_url());
        let bare = command.split('#').next().unwrap().trim();
        if let Some(assignment) = bare.strip_prefix("export ") {
            let (name, value) = assignment.split_once('=').unwrap();
            env.push((name.to_owned(), value.trim_matches('"').to_owned()));
            continue;
        }
        if let Some(args) = bare.strip_prefix("turnstile dev").and_then(|a| a.strip_suffix('&')) {
            // The harness starts it on port 0; files named in its arguments are the scratch directory's.
            let args = args
                .split_whitespace()
                .map(|a| {
                    let path = scratch.path().join(a);
                    if path.is_file() { path.display().to_string() } else { a.to_owned() }
                })
                .collect();
            let options = DevOptions { extra_args: args, env: env.clone(), ..DevOptions::default() };
            let dev = DevServer::start_with(options).await.unwrap();
            env.push(("TURNSTILE_ADDR".into(), dev.addr().to_string()));
            server = Some(dev);
            continue;
        }
        let run = tokio::process::Command::new("bash")
            .arg("-c")
            .arg(&command)
            .current_dir(scratch.path())
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("HOME", scratch.path())
            .output();
        let out = tokio::time::timeout(Duration::from_secs(120), run).await.expect("a quickstart command ran 120 s");
        let out = out.unwrap();
        assert!(
            out.status.success(),
            "`{command}` failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        last_output = String::from_utf8_lossy(&out.stdout).into_owned();
    }
    let server = server.expect("the quickstart starts `turnstile dev`");
    // examples/quickstart.py: the acceptance, the model's streamed answer, the turn's end, the session.
    let lines: Vec<&str> = last_output.lines().collect();
    assert_eq!(lines.first(), Some(&"accepted at seq 1, turn 1"), "{last_output}\n{}", server.log_tail());
    let end = lines
        .iter()
        .position(|l| *l == "turn 1 ended: completed")
        .unwrap_or_else(|| panic!("the turn completed:\n{last_output}\nserver log:\n{}", server.log_tail()));
    let answer = lines[1..end].join("\n");
    assert!(!answer.trim().is_empty(), "the model streamed an answer:\n{last_output}");
    let session = lines[end + 1];
    assert!(
        session.starts_with("session quickstart-") && session.contains(": SESSION_STATUS_IDLE, last seq "),
        "{session}"
    );
    println!("{last_output}");
    server.stop().await;
}
