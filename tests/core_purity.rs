//! The registry core stays pure (docs/rules.md, rule 10; layer 1 of docs/architecture.md): no code
//! line under `src/registry/` may name an async runtime, storage, network,
//! clock, randomness, environment or randomly seeded hasher. Clippy's
//! `disallowed-methods` (clippy.toml) backs this up across the crate.

use std::fs;
use std::path::Path;

const FORBIDDEN: &[&str] = &[
    "tokio",
    "sled",
    "tonic",
    "openraft",
    "prost",
    "rand::",
    "async ",
    ".await",
    "std::time",
    "SystemTime",
    "Instant",
    "std::fs",
    "std::net",
    "std::env",
    "std::thread",
    "std::process",
    "HashMap",
    "HashSet",
    "RandomState",
    "getrandom",
];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in fs::read_dir(dir).expect("src/registry exists") {
        let path = entry.expect("readable directory").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn registry_core_names_no_io_clock_or_randomness() {
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src/registry"),
        &mut files,
    );
    assert!(files.len() >= 5, "found the core's files");
    let mut violations = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).expect("readable source");
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for word in FORBIDDEN {
                if code.contains(word) {
                    violations.push(format!("{}:{}: {word}", file.display(), number + 1));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "impure core:\n{}",
        violations.join("\n")
    );
}
