//! stategate: a safe home for OpenTofu/Terraform state in front of an S3-compatible store.
//! See ARCHITECTURE.md for the map.

pub mod address;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod crypto;
pub mod drain;
pub mod drift;
pub mod error;
pub mod http;
pub mod installation;
pub mod jobs;
pub mod keys;
pub mod log;
pub mod metrics;
pub mod names;
pub mod operator;
pub mod schema;
pub mod server;
pub mod store;
pub mod tfstate;
pub mod tofu;
pub mod tokens;
pub mod turns;
pub mod ui;

/// What the source-scan tests (boundaries a reviewer would otherwise check by hand, e.g.
/// `http::error`'s and `store::index`'s) read: every `.rs` file under `src/`.
#[cfg(test)]
pub(crate) fn source_files() -> Vec<(std::path::PathBuf, String)> {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&source_root(), &mut files);
    assert!(files.len() > 20, "found the sources");
    files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            (f, text)
        })
        .collect()
}

/// `src/` of this crate.
#[cfg(test)]
pub(crate) fn source_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Rules of the code's shape, checked over the sources (issue 39).
#[cfg(test)]
pub(crate) mod source_rules {
    /// A production function longer than this needs a reason written beside it.
    const MAX_FN_LINES: usize = 120;
    /// What the comment directly above a longer function starts its reason with.
    const REASON: &str = "Long because:";

    /// The lines of `text` inside `#[cfg(test)]` items (a test module, a test-only
    /// function), by index. rustfmt puts an item's closing `}` alone on a line at the
    /// item's indentation, so the first such line ends it.
    fn test_only(lines: &[&str]) -> Vec<bool> {
        let mut skip = vec![false; lines.len()];
        let mut i = 0;
        while i < lines.len() {
            if lines[i].trim() == "#[cfg(test)]" {
                let mut item = i + 1;
                while item < lines.len() && lines[item].trim_start().starts_with("#[") {
                    item += 1;
                }
                let end = match lines.get(item) {
                    Some(line) if !line.trim_end().ends_with(';') => {
                        closing(lines, item, indent(line)).unwrap_or(lines.len() - 1)
                    }
                    _ => item.min(lines.len() - 1),
                };
                skip[i..=end].iter_mut().for_each(|s| *s = true);
                i = end;
            }
            i += 1;
        }
        skip
    }

    /// The production lines of `text` with their indexes: every line outside a
    /// `#[cfg(test)]` item ([`test_only`]). What every source scan reads.
    pub(crate) fn production(text: &str) -> Vec<(usize, &str)> {
        let lines: Vec<&str> = text.lines().collect();
        let skip = test_only(&lines);
        lines
            .into_iter()
            .enumerate()
            .filter(|(n, _)| !skip[*n])
            .collect()
    }

    fn indent(line: &str) -> &str {
        &line[..line.len() - line.trim_start().len()]
    }

    /// The index of the first line after `from` that is `indent` and `}` alone.
    fn closing(lines: &[&str], from: usize, indent: &str) -> Option<usize> {
        (from + 1..lines.len()).find(|&i| {
            lines[i]
                .strip_prefix(indent)
                .is_some_and(|rest| rest == "}")
        })
    }

    /// The name of the function a line declares, if it does.
    fn declared_fn(line: &str) -> Option<&str> {
        let mut rest = line.trim_start();
        if let Some(after) = rest.strip_prefix("pub") {
            rest = match after.strip_prefix('(') {
                Some(scoped) => scoped.split_once(") ")?.1,
                None => after.strip_prefix(' ')?,
            };
        }
        for qualifier in ["const ", "async ", "unsafe "] {
            rest = rest.strip_prefix(qualifier).unwrap_or(rest);
        }
        let name = rest.strip_prefix("fn ")?;
        let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
        (end > 0).then(|| &name[..end])
    }

    /// Does the comment and attribute block directly above line `at` give a reason?
    fn reasoned(lines: &[&str], at: usize) -> bool {
        lines[..at]
            .iter()
            .rev()
            .map(|l| l.trim_start())
            .take_while(|l| l.starts_with("//") || l.starts_with("#["))
            .any(|l| l.contains(REASON))
    }

    /// Every production function of `text` longer than [`MAX_FN_LINES`] with no
    /// reason above it: (name, first line, length in lines).
    fn long_functions(text: &str) -> Vec<(String, usize, usize)> {
        let lines: Vec<&str> = text.lines().collect();
        let skip = test_only(&lines);
        let mut found = Vec::new();
        for (at, line) in lines.iter().enumerate() {
            let Some(name) = declared_fn(line).filter(|_| !skip[at]) else {
                continue;
            };
            // The signature ends at the line that opens the body (or ends a bodiless
            // declaration, or holds the whole function).
            let Some(open) = (at..lines.len()).find(|&i| {
                let l = lines[i].trim_end();
                l.ends_with('{') || l.ends_with(';') || l.ends_with('}')
            }) else {
                continue;
            };
            if !lines[open].trim_end().ends_with('{') {
                continue;
            }
            let Some(end) = closing(&lines, open, indent(line)) else {
                continue;
            };
            let length = end - at + 1;
            if length > MAX_FN_LINES && !reasoned(&lines, at) {
                found.push((name.to_string(), at + 1, length));
            }
        }
        found
    }

    #[test]
    fn no_long_function_without_a_reason() {
        let src = crate::source_root();
        let mut offenders = Vec::new();
        for (file, text) in crate::source_files() {
            let relative = file.strip_prefix(&src).unwrap_or(&file).to_string_lossy();
            for (name, line, length) in long_functions(&text) {
                offenders.push(format!(
                    "src/{relative}:{line}: fn {name} is {length} lines"
                ));
            }
        }
        offenders.sort();
        assert!(
            offenders.is_empty(),
            "functions over {MAX_FN_LINES} lines: split each into named steps, or write \
             `// {REASON} …` directly above it:\n{}",
            offenders.join("\n")
        );
    }

    /// The scanner itself: what it counts, what it skips, what a reason is.
    #[test]
    fn the_scan_counts_bodies_and_skips_tests_and_reasons() {
        let body = |n: usize| "    let x = 1;\n".repeat(n);
        let long = format!(
            "pub(crate) async fn long(\n    a: u8,\n) -> u8 {{\n{}}}\n",
            body(118)
        );
        assert_eq!(long_functions(&long), vec![("long".into(), 1, 122)]);
        let short = format!("fn short() {{\n{}}}\n", body(118));
        assert_eq!(long_functions(&short), vec![]);
        let reasoned = format!("/// Does x.\n// {REASON} one arm per route.\n#[allow(x)]\n{long}");
        assert_eq!(long_functions(&reasoned), vec![]);
        let indented: String = long.lines().map(|l| format!("    {l}\n")).collect();
        let in_tests = format!("#[cfg(test)]\nmod tests {{\n{indented}}}\n");
        assert_eq!(long_functions(&in_tests), vec![]);
        let nested = format!("impl X {{\n    fn m() {{\n{}    }}\n}}\n", body(120));
        assert_eq!(long_functions(&nested), vec![("m".into(), 2, 122)]);
        let bodiless = "trait T {\n    fn t(&self);\n}\nfn one() { 1 }\n";
        assert_eq!(long_functions(bodiless), vec![]);
    }

    /// `http/` passes plain values to domain functions, which own their transactions:
    /// no handler opens one or holds a connection.
    #[test]
    fn http_opens_no_transaction() {
        const TRANSACTION: &[&str] = &[
            "admin_write",
            "index_handle",
            "Connection",
            "store::sql",
            "store::Db",
        ];
        let http = crate::source_root().join("http");
        for (file, text) in crate::source_files()
            .iter()
            .filter(|(f, _)| f.starts_with(&http))
        {
            for (at, line) in production(text) {
                if let Some(word) = TRANSACTION.iter().find(|w| line.contains(*w)) {
                    panic!("{}:{}: `{word}` in http/", file.display(), at + 1);
                }
            }
        }
    }

    /// A library file's module path (`store/sql.rs` → `store::sql`, `store/mod.rs` →
    /// `store`, `lib.rs` → the root); `None` for the binary's (`main.rs`, `cli/`).
    fn module_of(relative: &std::path::Path) -> Option<Vec<String>> {
        let mut parts: Vec<String> = relative
            .with_extension("")
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if parts.first().is_some_and(|p| p == "main" || p == "cli") {
            return None;
        }
        if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
            parts.pop();
        }
        Some(parts)
    }

    /// The modules a file's production code names by a `crate::…` or `super::…` path
    /// (groups `{a, b::c}` included), as the segments after the root; `at` is the
    /// file's own module (`super` is its parent, for a `mod.rs` as for any other file).
    /// Comments are dropped, so a doc link names nothing.
    fn named_paths(text: &str, at: &[String]) -> Vec<Vec<String>> {
        let lines: Vec<&str> = text.lines().collect();
        let skip = test_only(&lines);
        let code: String = lines
            .iter()
            .enumerate()
            .map(|(n, line)| match (skip[n], line.find("//")) {
                (true, _) => "",
                (false, Some(comment)) => &line[..comment],
                (false, None) => line,
            })
            .collect::<Vec<_>>()
            .join("\n");
        let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
        let mut found = Vec::new();
        for (start, _) in code.match_indices("::") {
            let before = &code[..start];
            let word_start = before.rfind(|c: char| !ident(c)).map_or(0, |i| i + 1);
            let root = &before[word_start..];
            if root != "crate" && root != "super" {
                continue;
            }
            if code[..word_start].ends_with("::") {
                continue; // `super::super::x` is read from its first `super`
            }
            let mut base: Vec<String> = if root == "crate" {
                Vec::new()
            } else {
                at[..at.len().saturating_sub(1)].to_vec()
            };
            let mut rest = &code[start + 2..];
            while let Some(after) = rest.strip_prefix("super::") {
                base.pop();
                rest = after;
            }
            let head_len = rest
                .find(|c: char| !ident(c) && c != ':')
                .unwrap_or(rest.len());
            let head: Vec<String> = rest[..head_len]
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            let mut path = base.clone();
            path.extend(head.iter().cloned());
            if rest[head_len..].starts_with('{') {
                let group = &rest[head_len + 1..rest.find('}').unwrap_or(rest.len())];
                for item in group.split(',') {
                    let mut each = path.clone();
                    each.extend(
                        item.trim()
                            .split("::")
                            .take_while(|s| !s.is_empty() && s.chars().all(ident))
                            .map(str::to_string),
                    );
                    found.push(each);
                }
            }
            found.push(path);
        }
        found
    }

    /// No two library files import each other, through any number of files (a circle
    /// makes a change to one a change to all): every `crate::…`/`super::…` path is an
    /// arrow to the longest module it names, and the graph has no strongly connected
    /// part larger than one file.
    #[test]
    fn no_import_circle() {
        use std::collections::{BTreeMap, BTreeSet};
        let src = crate::source_root();
        let files = crate::source_files();
        let mut modules: BTreeMap<Vec<String>, String> = BTreeMap::new();
        let mut texts = Vec::new();
        for (file, text) in &files {
            let relative = file.strip_prefix(&src).unwrap_or(file);
            if let Some(module) = module_of(relative) {
                modules.insert(module.clone(), relative.display().to_string());
                texts.push((module, text));
            }
        }
        let mut arrows: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (module, text) in &texts {
            let from = &modules[module];
            let own = arrows.entry(from.clone()).or_default();
            for path in named_paths(text, module) {
                let to = (1..=path.len())
                    .rev()
                    .find_map(|n| modules.get(&path[..n]))
                    .filter(|to| *to != from);
                own.extend(to.cloned());
            }
        }
        // Tarjan's strongly connected components.
        struct Walk<'a> {
            arrows: &'a BTreeMap<String, BTreeSet<String>>,
            index: BTreeMap<&'a str, usize>,
            low: BTreeMap<&'a str, usize>,
            stack: Vec<&'a str>,
            circles: Vec<Vec<&'a str>>,
        }
        fn visit<'a>(w: &mut Walk<'a>, at: &'a str) {
            let n = w.index.len();
            w.index.insert(at, n);
            w.low.insert(at, n);
            w.stack.push(at);
            for to in w.arrows.get(at).into_iter().flatten() {
                if !w.index.contains_key(to.as_str()) {
                    visit(w, to);
                    let low = w.low[at].min(w.low[to.as_str()]);
                    w.low.insert(at, low);
                } else if w.stack.contains(&to.as_str()) {
                    let low = w.low[at].min(w.index[to.as_str()]);
                    w.low.insert(at, low);
                }
            }
            if w.low[at] == w.index[at] {
                let mut part = Vec::new();
                while let Some(top) = w.stack.pop() {
                    part.push(top);
                    if top == at {
                        break;
                    }
                }
                if part.len() > 1 {
                    part.sort();
                    w.circles.push(part);
                }
            }
        }
        let mut walk = Walk {
            arrows: &arrows,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            circles: Vec::new(),
        };
        for file in arrows.keys() {
            if !walk.index.contains_key(file.as_str()) {
                visit(&mut walk, file);
            }
        }
        assert!(
            walk.circles.is_empty(),
            "files that import each other (move what both need below both): {:?}",
            walk.circles
        );
    }

    /// The import reader itself: paths, groups, `super`, comments and tests.
    #[test]
    fn the_import_reader_names_modules() {
        let at = ["ui".to_string(), "oidc".to_string()];
        let text = "use super::{session::Sessions, sso_rows};\n\
                    use crate::store::sql::Connection;\n\
                    // crate::http::ui is only a comment\n\
                    fn f() { crate::tofu::scope(\"x\"); }\n\
                    #[cfg(test)]\nmod tests {\n    use crate::drift::X;\n}\n";
        let named: Vec<String> = named_paths(text, &at)
            .iter()
            .map(|p| p.join("::"))
            .collect();
        for want in [
            "ui::session::Sessions",
            "ui::sso_rows",
            "store::sql::Connection",
            "tofu::scope",
        ] {
            assert!(named.iter().any(|n| n == want), "{want} in {named:?}");
        }
        assert!(
            !named
                .iter()
                .any(|n| n.starts_with("http") || n.starts_with("drift")),
            "{named:?}"
        );
    }
}
