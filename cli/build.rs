//! Sets `TURNSTILE_COMMIT` for the binary (`turnstile --version`, `turnstile_build_info`): the environment
//! variable of the same name when the build sets it (the Dockerfile's build argument: its context has no
//! `.git`), else `git rev-parse` of the checkout, else `unknown`.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-env-changed=TURNSTILE_COMMIT");
    let commit = std::env::var("TURNSTILE_COMMIT").ok().filter(|c| !c.trim().is_empty()).or_else(git_commit);
    println!("cargo::rustc-env=TURNSTILE_COMMIT={}", commit.as_deref().unwrap_or("unknown").trim());
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

/// The checked-out commit, and a rerun of this script when HEAD or its branch moves: only the files that
/// exist (a packed ref has no file of its own, and a missing path would rerun this on every build).
fn git_commit() -> Option<String> {
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name])
            && Path::new(&path).exists()
        {
            println!("cargo::rerun-if-changed={path}");
        }
    }
    Some(commit)
}
