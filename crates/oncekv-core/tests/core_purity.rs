//! The registry core stays pure (docs/rules.md, rule 10; layer 1 of
//! docs/architecture.md): no code line of this crate's `src/` may name an
//! async runtime, storage, network, clock, randomness, environment or
//! randomly seeded hasher, and the crate depends on nothing but its five
//! libraries. Clippy's `disallowed-methods` (the workspace's clippy.toml)
//! backs this up.

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

/// The only libraries the core may depend on.
const ALLOWED_DEPENDENCIES: &[&str] = &["bincode", "blake3", "imbl", "serde", "thiserror"];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in fs::read_dir(dir).expect("the core's src/ exists") {
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
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
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

#[test]
fn registry_core_depends_only_on_its_five_libraries() {
    let manifest = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .expect("readable manifest");
    let mut section = String::new();
    let mut dependencies = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.trim_matches(['[', ']']).to_string();
            // `[dependencies.name]` names one dependency by itself.
            if let Some(name) = section.strip_prefix("dependencies.") {
                dependencies.push(name.to_string());
            }
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // `[dependencies]`, `[target.'…'.dependencies]` and
        // `[build-dependencies]` all reach the library; dev-dependencies
        // (the benchmark's criterion) do not.
        if section == "dependencies"
            || section == "build-dependencies"
            || section.ends_with(".dependencies")
        {
            let name = line.split(['=', ' ', '.']).next().unwrap_or_default();
            dependencies.push(name.to_string());
        }
    }
    assert!(!dependencies.is_empty(), "found the core's dependencies");
    let foreign: Vec<_> = dependencies
        .iter()
        .filter(|name| !ALLOWED_DEPENDENCIES.contains(&name.as_str()))
        .collect();
    assert!(foreign.is_empty(), "the core depends on {foreign:?}");
}
