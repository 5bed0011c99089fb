//! The server's two adapters do not know each other (layers 2 and 4 of
//! docs/architecture.md): no code line under `src/network/` names
//! `crate::storage`, none under `src/storage/` names `crate::network`, and
//! the state they share (`src/shared/`) names neither. What both need lives
//! in `src/shared/`. Inside one package this is not a compile error, so this
//! test reads the sources, as the core's `core_purity.rs` does.

use std::fs;
use std::path::{Path, PathBuf};

/// Each directory under `src/`, and the modules its code must not name.
const RULES: &[(&str, &[&str])] = &[
    ("network", &["storage"]),
    ("storage", &["network"]),
    ("shared", &["network", "storage"]),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("the source directory exists") {
        let path = entry.expect("readable directory").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The code of `text` without `//` comments, as one string: a `use`
/// statement may spread over lines (`use crate::{\n    storage::X,\n};`).
fn code(text: &str) -> String {
    text.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `code` holds the path `path` as a whole name (not the start of
/// a longer one: `crate::storage` is not in `crate::storage_x`).
fn names(code: &str, path: &str) -> bool {
    code.match_indices(path).any(|(start, _)| {
        !code[start + path.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
    })
}

/// Ways the code of a file under `src/<dir>/` (at `depth` below `src/`)
/// can reach the module `forbidden`: a path (`crate::storage`, or as many
/// `super::` as lead back to `src/`), or a name in a `use crate::{...}`
/// group.
fn reaches(code: &str, depth: usize, forbidden: &str) -> bool {
    let by_path = format!("crate::{forbidden}");
    let by_super = format!("{}{forbidden}", "super::".repeat(depth));
    if names(code, &by_path) || names(code, &by_super) {
        return true;
    }
    code.match_indices("crate::{").any(|(start, _)| {
        let group = &code[start..];
        let group = &group[..group.find(';').unwrap_or(group.len())];
        group
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|word| word == forbidden)
    })
}

#[test]
fn adapters_and_their_shared_state_do_not_name_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut violations = Vec::new();
    for (dir, forbidden) in RULES {
        let mut files = Vec::new();
        rust_files(&src.join(dir), &mut files);
        assert!(!files.is_empty(), "found the files of src/{dir}");
        for file in &files {
            let text = fs::read_to_string(file).expect("readable source");
            // `src/network/mod.rs` is one below `src/` for `super::`, a file
            // beside it two, and so on.
            let relative = file.strip_prefix(&src).expect("under src/");
            let depth = relative.components().count() - usize::from(relative.ends_with("mod.rs"));
            for module in *forbidden {
                if reaches(&code(&text), depth, module) {
                    violations.push(format!("{}: names {module}", relative.display()));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "an adapter names the other (what both need belongs in src/shared/):\n{}",
        violations.join("\n")
    );
}

/// The check itself catches each form of reaching a module.
#[test]
fn every_form_of_naming_a_module_is_caught() {
    assert!(reaches("use crate::storage::SharedState;", 2, "storage"));
    assert!(reaches("let x = crate::storage::X::new();", 2, "storage"));
    assert!(reaches("use super::super::storage::X;", 2, "storage"));
    assert!(reaches("use crate::{clock, storage::X};", 2, "storage"));
    assert!(reaches("use crate::{\n    storage,\n};", 2, "storage"));
    assert!(!reaches("use crate::shared::SharedState;", 2, "storage"));
    assert!(!reaches(
        "use openraft::storage::RaftLogStorage;",
        2,
        "storage"
    ));
    assert!(!reaches("use super::storage_format;", 1, "storage"));
    assert!(!reaches("use crate::{clock, storage_x::Y};", 2, "storage"));
}
