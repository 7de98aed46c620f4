//! Every `stategate …` command line the README and docs/ show a user names a command
//! that exists, with flags that command takes: each is run as `<its subcommands> --help`
//! against the real binary, and every `--flag` it uses must be in that help.
//!
//! Command lines are taken from fenced shell blocks and from inline code spans; a line
//! continued with `\` is joined first.

use std::path::{Path, PathBuf};
use std::process::Command;

fn doc_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// `stategate …` invocations in one markdown text: (line number, words after `stategate`).
fn invocations(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut found = Vec::new();
    let mut in_block = false;
    let mut joined = String::new();
    let mut joined_from = 0;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            in_block = !in_block;
            continue;
        }
        let mut candidates: Vec<String> = Vec::new();
        if in_block {
            if joined.is_empty() {
                joined_from = n + 1;
            }
            if let Some(head) = line.strip_suffix('\\') {
                joined.push_str(head);
                joined.push(' ');
                continue;
            }
            joined.push_str(line);
            candidates.push(std::mem::take(&mut joined));
        } else {
            joined_from = n + 1;
            // Inline code spans: `…`.
            candidates.extend(line.split('`').skip(1).step_by(2).map(str::to_string));
        }
        for c in candidates {
            // A shell line may hold the command after `$(`, `eval "$(`, `&&`, `|`, `sudo`.
            for part in c.split(['(', '|', ';', '&']) {
                let words: Vec<&str> = part.split_whitespace().collect();
                // The command position: after `sudo`, `env`, `time` and `X=y` assignments.
                let at = words.iter().position(|w| {
                    !matches!(*w, "sudo" | "env" | "time" | "$" | "\"$") && !w.contains('=')
                });
                let Some(at) = at.filter(|&at| {
                    let w = words[at].trim_matches('"');
                    w == "stategate" || w.ends_with("/stategate")
                }) else {
                    continue;
                };
                let mut after = &words[at + 1..];
                // The global `-c FILE` / `--config FILE` before the command.
                while let [flag, _value, rest @ ..] = after {
                    if matches!(*flag, "-c" | "--config") {
                        after = rest;
                    } else {
                        break;
                    }
                }
                let rest: Vec<String> = after
                    .iter()
                    .take_while(|w| !w.starts_with('#'))
                    .map(|w| {
                        w.trim_matches(|c| c == '"' || c == '\'' || c == ')')
                            .to_string()
                    })
                    .collect();
                if rest.first().is_some_and(|w| {
                    w.chars().all(|c| c.is_ascii_lowercase() || c == '-') && !w.is_empty()
                        || w.starts_with("--")
                }) {
                    found.push((joined_from, rest));
                }
            }
        }
    }
    found
}

fn help(bin: &Path, words: &[String]) -> (bool, String) {
    thread_local! {
        static SEEN: std::cell::RefCell<std::collections::HashMap<Vec<String>, (bool, String)>> =
            Default::default();
    }
    if let Some(known) = SEEN.with(|s| s.borrow().get(words).cloned()) {
        return known;
    }
    let out = Command::new(bin)
        .args(words)
        .arg("--help")
        .env_remove("STATEGATE_CONFIG")
        .output()
        .expect("run stategate");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let answer = (out.status.success(), text);
    SEEN.with(|s| s.borrow_mut().insert(words.to_vec(), answer.clone()));
    answer
}

#[test]
fn every_command_line_in_the_docs_names_a_real_command_and_real_flags() {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_stategate"));
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).expect("read doc");
        let name = file.file_name().map(|n| n.to_string_lossy().to_string());
        for (line, words) in invocations(&text) {
            // The subcommand path: the leading words until a flag, a placeholder or a value.
            let path: Vec<String> = words
                .iter()
                .take_while(|w| {
                    !w.starts_with('-') && w.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                })
                .cloned()
                .collect();
            let flags: Vec<String> = words
                .iter()
                .filter(|w| w.starts_with("--") && w.len() > 2)
                .map(|w| w.split('=').next().unwrap_or(w).to_string())
                .collect();
            // Positional values (a workspace called `prod`) look like subcommands: walk
            // down while the word is one of the subcommands the help lists.
            let mut resolved: Vec<String> = Vec::new();
            let (mut ok, mut text) = help(&bin, &resolved);
            for w in &path {
                let is_sub = text.lines().any(|l| {
                    let l = l.trim_start();
                    l.split_whitespace().next() == Some(w.as_str())
                });
                if !is_sub {
                    break;
                }
                resolved.push(w.clone());
                (ok, text) = help(&bin, &resolved);
                if !ok {
                    break;
                }
            }
            checked += 1;
            let here = format!(
                "{}:{line}: stategate {}",
                name.as_deref().unwrap_or("?"),
                words.join(" ")
            );
            if !ok {
                problems.push(format!("{here}\n    `--help` failed: {text}"));
                continue;
            }
            // The first word must be a command (or a global flag).
            if resolved.is_empty() && !path.is_empty() {
                problems.push(format!("{here}\n    no command `{}`", path[0]));
                continue;
            }
            // A leaf command with subcommands of its own must be given one.
            let needs_sub = text.contains("Usage:") && text.contains("<COMMAND>");
            if needs_sub && path.len() == resolved.len() && !words.is_empty() && !flags.is_empty() {
                problems.push(format!(
                    "{here}\n    `{}` needs a subcommand",
                    resolved.join(" ")
                ));
                continue;
            }
            if path.len() > resolved.len() && needs_sub {
                problems.push(format!(
                    "{here}\n    `{}` has no subcommand `{}`",
                    resolved.join(" "),
                    path[resolved.len()]
                ));
                continue;
            }
            for f in flags {
                let known = text
                    .split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
                    .any(|t| t == f || t.starts_with(&format!("{f}=")));
                if !known {
                    problems.push(format!(
                        "{here}\n    `{f}` is not a flag of `stategate {}`",
                        resolved.join(" ")
                    ));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} command lines found: is the extraction broken?"
    );
    assert!(
        problems.is_empty(),
        "{} doc command lines are wrong:\n{}",
        problems.len(),
        problems.join("\n")
    );
}
