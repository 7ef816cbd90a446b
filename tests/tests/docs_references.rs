//! Every repository path a document or a Rust doc comment names exists (issue 31): a reader who follows
//! `docs/decisions/0021-…md`, `journal/src/jetstream/group.rs` or a Markdown link finds the file.
//!
//! Nothing here lists the repository's files: the paths are read from the documents at test time, and what
//! counts as a path is decided by the tree as it is (a token whose first component is a top-level entry of
//! the checkout), so moving a crate only needs the documents that name it to follow.
//!
//! What is checked, in every `.md` file (outside `target/`, `node_modules/`, hidden directories and build
//! output) and in every `//!` and `///` line of every `.rs` file:
//! - Markdown links `[text](path)` that are not URLs or anchors, relative to the document;
//! - tokens like `dir/…/name.ext` or `dir/…/` whose first component `dir` is a top-level entry of the
//!   checkout, relative to the checkout, the document's directory or its crate, or as the end of some
//!   path in the checkout (a module path such as `llm/http.rs` in a crate's own docs);
//! - bare `*.md` names, which must exist next to the document, in its crate or at the top: a bare file
//!   name in a crate's comment that is none of these names nothing a reader can open.
//!
//! Placeholders (`NNNN`, `…`, `<p>`, globs) and hidden runtime paths (`deploy/local/.run/`) are skipped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Directories never searched for documents: build output, installed packages, VCS and tool state.
fn skipped_dir(name: &str) -> bool {
    name.starts_with('.') || matches!(name, "target" | "node_modules" | "dist")
}

/// Every file and directory under `dir`, relative to `root`, outside build output and VCS state.
fn tree(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if matches!(name.as_str(), "target" | "node_modules" | ".git") {
            continue;
        }
        out.push(path.strip_prefix(root).unwrap().to_string_lossy().into_owned());
        if path.is_dir() {
            tree(root, &path, out);
        }
    }
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !skipped_dir(&name) {
                files(&path, out);
            }
        } else if name.ends_with(".md") || name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// The text of `path` that documents: all of a Markdown file; the `//!` and `///` lines of a Rust file.
fn documentation(path: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    let rust = path.extension().is_some_and(|e| e == "rs");
    text.lines()
        .enumerate()
        .filter_map(|(i, line)| {
            if !rust {
                return Some((i + 1, line.to_owned()));
            }
            let trimmed = line.trim_start();
            let doc = trimmed.strip_prefix("//!").or_else(|| trimmed.strip_prefix("///"))?;
            Some((i + 1, doc.to_owned()))
        })
        .collect()
}

/// Extensions of the files documents name.
const EXTENSIONS: [&str; 21] = [
    "rs", "md", "toml", "proto", "sh", "py", "ts", "mjs", "js", "json", "yaml", "yml", "conf", "env", "txt", "html",
    "css", "lock", "png", "pem", "gguf",
];

fn is_placeholder(token: &str) -> bool {
    token.contains("NNNN")
        || token.contains('*')
        || token.contains('{')
        || token.contains('<')
        || token.contains("...")
        || token.contains('…')
        || token.contains("$(")
        || token.contains('$')
}

/// `(target, line)` of every Markdown link on `line` that names a local file.
fn links(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split('#').next().unwrap().trim();
        let external = target.contains("://") || target.starts_with("mailto:");
        if !target.is_empty() && !external && !target.contains(' ') {
            out.push(target.to_owned());
        }
        rest = &after[end..];
    }
    out
}

/// Tokens of `line` that look like repository paths: runs of path characters.
fn path_tokens(line: &str, top_level: &BTreeSet<String>) -> Vec<String> {
    let is_path_char = |c: char| c.is_ascii_alphanumeric() || "._/-".contains(c) || "*{}<>$()…".contains(c);
    let mut out = Vec::new();
    for word in line.split(|c: char| !is_path_char(c)) {
        // URLs, absolute paths, `../` outside the checkout and sentence ends are not repository paths.
        let word = word.trim_start_matches('(').trim_end_matches(['.', ')', '(']);
        if word.is_empty()
            || word.starts_with('/')
            || word.starts_with('.')
            || word.contains("/.")
            || is_placeholder(word)
        {
            continue;
        }
        let (first, rest) = match word.split_once('/') {
            Some((first, rest)) => (first, Some(rest)),
            None => (word, None),
        };
        match rest {
            // A bare `NAME.md`.
            None => {
                if word.ends_with(".md") && word.len() > 3 {
                    out.push(word.to_owned());
                }
            }
            Some(rest) => {
                if !top_level.contains(first) {
                    continue;
                }
                let last = rest.rsplit('/').next().unwrap();
                let is_dir = rest.is_empty() || word.ends_with('/');
                let has_ext =
                    last.rsplit_once('.').is_some_and(|(stem, ext)| !stem.is_empty() && EXTENSIONS.contains(&ext));
                if is_dir || has_ext {
                    out.push(word.to_owned());
                }
            }
        }
    }
    out
}

/// The nearest directory at or above `file` with a `Cargo.toml` (its crate), if any below the root.
fn crate_dir(file: &Path, root: &Path) -> Option<PathBuf> {
    let mut dir = file.parent()?;
    while dir.starts_with(root) && dir != root {
        if dir.join("Cargo.toml").exists() {
            return Some(dir.to_path_buf());
        }
        dir = dir.parent()?;
    }
    None
}

#[test]
fn every_path_a_document_names_exists() {
    let root = root();
    let top_level: BTreeSet<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !skipped_dir(n))
        .collect();
    let mut documents = Vec::new();
    files(&root, &mut documents);
    let mut everything = Vec::new();
    tree(&root, &root, &mut everything);
    // `llm/http.rs` in the agent crate's docs: the end of `agent/src/llm/http.rs`.
    let ends_a_path = |path: &str| {
        let path = path.trim_end_matches('/');
        path.contains('/') && everything.iter().any(|p| p.ends_with(&format!("/{path}")))
    };
    let mut missing = Vec::new();
    let mut checked = 0;
    for file in &documents {
        let dir = file.parent().unwrap();
        let krate = crate_dir(file, &root);
        let markdown = file.extension().is_some_and(|e| e == "md");
        let mut in_fence = false;
        for (number, line) in documentation(file) {
            let fence = line.trim_start().starts_with("```");
            if fence {
                in_fence = !in_fence;
                continue;
            }
            let mut candidates: Vec<(String, bool)> = Vec::new();
            if markdown && !in_fence {
                candidates.extend(links(&line).into_iter().map(|l| (l, true)));
            }
            candidates.extend(path_tokens(&line, &top_level).into_iter().map(|t| (t, false)));
            for (path, is_link) in candidates {
                checked += 1;
                let bases: Vec<&Path> = if is_link {
                    vec![dir]
                } else {
                    [Some(root.as_path()), Some(dir), krate.as_deref()].into_iter().flatten().collect()
                };
                if !bases.iter().any(|base| base.join(&path).exists()) && (is_link || !ends_a_path(&path)) {
                    let shown = file.strip_prefix(&root).unwrap().display().to_string();
                    missing.push(format!("{shown}:{number}: `{path}`"));
                }
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "{} references to files that do not exist (write the path from the top of the checkout, e.g. \
         `docs/API.md`, or fix the name):\n{}",
        missing.len(),
        missing.join("\n")
    );
    assert!(checked > 300, "the documents name files ({checked} references checked)");
}

#[test]
fn the_extractor_finds_paths_and_skips_what_is_not_one() {
    let top: BTreeSet<String> = ["docs", "journal", "agent"].into_iter().map(str::to_owned).collect();
    let line = "see docs/API.md, `journal/src/jetstream/group.rs` and SPEC.md; not agent/status, \
                docs/decisions/NNNN-name.md, turnstile.ev.<p>, https://x.example/docs/a.md or docs/";
    assert_eq!(
        path_tokens(line, &top),
        ["docs/API.md", "journal/src/jetstream/group.rs", "SPEC.md", "docs/"],
        "{line}"
    );
    assert_eq!(links("a [link](SPEC.md#2-delivery) and [web](https://x.example/a.md)"), ["SPEC.md"]);
}
