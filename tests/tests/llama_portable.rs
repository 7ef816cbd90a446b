//! The installed llama.cpp runs on every x86-64 machine of our kind (decision 0041): its machine code has
//! no instruction that a supported CPU or virtual machine may lack. An Intel VM that advertises AMX but
//! does not let a process use the tiles killed a natively built llama-server with SIGILL (`tilezero
//! %tmm4` in an AMX kernel); AVX-512 is missing on many AMD and older Intel machines.
//!
//! The check disassembles `LLAMA_SERVER_BIN` (a static build of llama.cpp: every ggml kernel is in this
//! one file) and every shared library it loads from beside itself, and fails on any use of an AMX tile
//! register (`%tmm`) or an AVX-512 register (`%zmm`, the opmask registers `%k1`–`%k7`), naming the
//! functions that hold them. None is allowed: the build has no kernels chosen at run time
//! (`GGML_BACKEND_DL=OFF`), so any such code could be reached on a machine that cannot run it.
// Test code: a failed unwrap is a failed test, with the error in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use turnstile_tests::llama::llama_paths;

/// Registers that only AMX or AVX-512 code uses, as objdump (AT&T syntax) prints them.
const FORBIDDEN: [&str; 9] = ["%tmm", "%zmm", "%k1", "%k2", "%k3", "%k4", "%k5", "%k6", "%k7"];

/// Per function: how many instructions use a forbidden register, and the first such line.
fn forbidden_code(binary: &Path) -> BTreeMap<String, (usize, String)> {
    let mut child = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(binary)
        .stdout(Stdio::piped())
        .spawn()
        .expect("objdump (binutils, installed with the C++ compiler that builds llama.cpp)");
    let mut found: BTreeMap<String, (usize, String)> = BTreeMap::new();
    let mut function = String::from("?");
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        // `0000000000401000 <name>:` starts a function.
        if let Some(name) = line.strip_suffix(">:").and_then(|l| l.split_once(" <")).map(|(_, n)| n) {
            function = name.to_owned();
            continue;
        }
        let Some((_, instruction)) = line.split_once(":\t") else { continue };
        if FORBIDDEN.iter().any(|r| instruction.contains(r)) {
            let entry = found.entry(function.clone()).or_insert_with(|| (0, instruction.trim().to_owned()));
            entry.0 += 1;
        }
    }
    assert!(child.wait().unwrap().success(), "objdump -d {} failed", binary.display());
    found
}

/// The binary and the shared libraries beside it (a shared build keeps libggml*.so there).
fn installed_files(server: &Path) -> Vec<PathBuf> {
    let dir = server.parent().unwrap();
    let mut files = vec![server.to_path_buf()];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.contains(".so") && path.is_file() && !path.is_symlink() {
            files.push(path);
        }
    }
    files
}

#[test]
fn the_installed_llama_server_uses_no_amx_or_avx512_instruction() {
    let (server, _) = llama_paths();
    let mut report = Vec::new();
    let mut instructions_seen = false;
    for file in installed_files(&server) {
        let found = forbidden_code(&file);
        instructions_seen = true;
        for (function, (count, first)) in found {
            report.push(format!("{}: {function}: {count} instructions, e.g. `{first}`", file.display()));
        }
    }
    assert!(instructions_seen);
    assert!(
        report.is_empty(),
        "llama.cpp was built with instructions that machines of our kind may lack (AMX or AVX-512); build it \
         with scripts/build-llama-server (GGML_NATIVE=OFF, AVX2 baseline):\n{}",
        report.join("\n")
    );
}

/// The scan finds what it looks for: an object compiled with AVX-512 here, by the same compiler, shows up.
#[test]
fn the_scan_finds_avx512_code_when_there_is_some() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("wide.c");
    std::fs::write(
        &source,
        "#include <immintrin.h>\n\
         __m512 wide_add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }\n",
    )
    .unwrap();
    let object = dir.path().join("wide.o");
    let status = Command::new("cc").args(["-O2", "-mavx512f", "-c"]).arg(&source).arg("-o").arg(&object).status();
    let status = status.expect("cc (installed with the C++ compiler that builds llama.cpp)");
    assert!(status.success());
    let found = forbidden_code(&object);
    assert!(found.contains_key("wide_add"), "{found:?}");
}
