//! Every command line the README (and `docs/*.md`) shows exists: each
//! `orderpipe ...` line in a `sh` block or in inline code, `cargo run ...
//! -- ARGS` lines, and `make TARGET` lines. No stack needed.
//!
//! A concrete line (`orderpipe dlq replay --id 42 --dry-run`) runs through
//! clap as written, plus `--help`: an unknown subcommand, flag or bad value
//! fails the parse. A synopsis (`orderpipe relay [--batch-size 500]`,
//! `--handler H[,H...]`, `key\|none`) cannot run as written, so its
//! subcommand's `--help` must succeed and list every `--flag` shown.
//! `README_CHECK_DEBUG=1` prints every line found and how it is checked.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where a command line was shown, and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shown {
    /// `README.md:123`.
    place: String,
    /// The command as written (one line, comments and prompts removed).
    text: String,
}

/// One shell-ish token; quoted text is a literal value, never a placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    text: String,
    quoted: bool,
}

/// The markdown files whose command lines are checked.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    if let Ok(entries) = std::fs::read_dir(root.join("docs")) {
        let mut docs: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "md"))
            .collect();
        docs.sort();
        files.extend(docs);
    }
    files
}

/// Shell command lines of `markdown`: the lines of ```sh/bash/shell/console
/// blocks (continuations joined, `$ ` prompts and `#` comments removed,
/// split at `;`, `&&`, `||` and pipes) and every inline code span.
fn command_lines(name: &str, markdown: &str) -> Vec<Shown> {
    let mut shown = Vec::new();
    let mut fence: Option<bool> = None; // Some(is_shell) inside a block
    let mut pending = String::new();
    let mut prose: Vec<(usize, &str)> = Vec::new();
    let lines: Vec<&str> = markdown.lines().collect();
    let flush_prose = |prose: &mut Vec<(usize, &str)>, shown: &mut Vec<Shown>| {
        // Inline code may wrap across the lines of a paragraph.
        let text: String = prose.iter().map(|(_, l)| *l).collect::<Vec<_>>().join("\n");
        let first = prose.first().map_or(0, |p| p.0);
        for (i, span) in text.split('`').enumerate().filter(|(i, _)| i % 2 == 1) {
            let offset: usize = text
                .split('`')
                .take(i)
                .map(|s| s.matches('\n').count())
                .sum();
            let span = span.replace('\n', " ");
            for part in split_commands(&span) {
                shown.push(Shown {
                    place: format!("{name}:{}", first + offset),
                    text: part,
                });
            }
        }
        prose.clear();
    };
    for (index, line) in lines.iter().enumerate() {
        let number = index + 1;
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            if fence.is_some() {
                fence = None;
            } else {
                flush_prose(&mut prose, &mut shown);
                let language = info.trim().to_ascii_lowercase();
                fence = Some(matches!(
                    language.as_str(),
                    "sh" | "bash" | "shell" | "console"
                ));
            }
            continue;
        }
        match fence {
            Some(true) => {
                let line = trimmed.strip_prefix("$ ").unwrap_or(trimmed);
                if let Some(head) = line.strip_suffix('\\') {
                    pending.push_str(head);
                    pending.push(' ');
                    continue;
                }
                let whole = std::mem::take(&mut pending) + line;
                for part in split_commands(strip_comment(&whole)) {
                    shown.push(Shown {
                        place: format!("{name}:{number}"),
                        text: part,
                    });
                }
            }
            Some(false) => {}
            None if trimmed.is_empty() => flush_prose(&mut prose, &mut shown),
            None => prose.push((number, line)),
        }
    }
    flush_prose(&mut prose, &mut shown);
    shown
}

/// `line` without a trailing `# comment` (a `#` after whitespace, outside quotes).
fn strip_comment(line: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut previous = ' ';
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None, '\'' | '"') => quote = Some(c),
            (None, '#') if previous.is_whitespace() => return &line[..i],
            _ => {}
        }
        previous = c;
    }
    line
}

/// Splits a shell line into its commands at `;`, `&&`, `||` and ` | `
/// (an escaped `\|` is the markdown-table spelling of an alternative).
fn split_commands(line: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let chars: Vec<char> = line.chars().collect();
    let mut quote: Option<char> = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None, '\'' | '"') => quote = Some(c),
            (None, '\\') if next == Some('|') => {
                parts.last_mut().unwrap().push_str("\\|");
                i += 2;
                continue;
            }
            (None, ';') => {
                parts.push(String::new());
                i += 1;
                continue;
            }
            (None, '&' | '|') if next == Some(c) => {
                parts.push(String::new());
                i += 2;
                continue;
            }
            (None, '|') => {
                parts.push(String::new());
                i += 1;
                continue;
            }
            _ => {}
        }
        parts.last_mut().unwrap().push(c);
        i += 1;
    }
    parts
        .into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// Shell words of `text`, quotes removed.
fn tokens(text: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut current: Option<Token> = None;
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => current
                .get_or_insert(Token {
                    text: String::new(),
                    quoted: true,
                })
                .text
                .push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                current
                    .get_or_insert(Token {
                        text: String::new(),
                        quoted: true,
                    })
                    .quoted = true;
            }
            (None, c) if c.is_whitespace() => out.extend(current.take()),
            (None, c) => current
                .get_or_insert(Token {
                    text: String::new(),
                    quoted: false,
                })
                .text
                .push(c),
        }
    }
    out.extend(current);
    out
}

/// What a shown line asks of this repository.
#[derive(Debug, PartialEq, Eq)]
enum Check {
    /// `orderpipe ARGS` (also through `cargo run ... --` or a path to the binary).
    Cli(Vec<Token>),
    /// `make TARGET...`.
    Make(Vec<String>),
}

fn check_of(text: &str) -> Option<Check> {
    let words = tokens(text);
    let program = words.first()?.text.clone();
    if program == "make" {
        // `make TARGET` in prose names no target; `VAR=value` and flags are not targets.
        let targets: Vec<String> = words[1..]
            .iter()
            .filter(|t| !is_synopsis(t))
            .map(|t| t.text.clone())
            .filter(|t| !t.starts_with('-') && !t.contains('='))
            .collect();
        return (!targets.is_empty()).then_some(Check::Make(targets));
    }
    if program == "cargo" && words.get(1).is_some_and(|w| w.text == "run") {
        let runs_orderpipe = words
            .windows(2)
            .any(|w| w[0].text == "--bin" && w[1].text == "orderpipe")
            || !words.iter().any(|w| w.text == "--bin");
        let dashes = words.iter().position(|w| w.text == "--" && !w.quoted);
        return match dashes {
            Some(i) if runs_orderpipe => Some(Check::Cli(words[i + 1..].to_vec())),
            _ => None,
        };
    }
    if Path::new(&program)
        .file_name()
        .is_some_and(|f| f == "orderpipe")
        && words.len() > 1
    {
        return Some(Check::Cli(words[1..].to_vec()));
    }
    None
}

/// A placeholder or synopsis mark: `N`, `ID`, `H[,H...]`, `KEY=VALUE`,
/// `[--flag`, `a\|b`, `...`.
fn is_synopsis(token: &Token) -> bool {
    if token.quoted {
        return false;
    }
    let t = token.text.as_str();
    let placeholder = t.split(['=', ',']).next().is_some_and(|head| {
        let head = head.trim_matches(['[', ']', '.']);
        !head.is_empty() && head.chars().all(|c| c.is_ascii_uppercase() || c == '_')
    });
    placeholder || t.contains(['[', ']']) || t.contains("\\|") || t == "..." || t.starts_with('<')
}

/// The subcommand path(s) of a synopsis: its leading lower-case words
/// (`list\|stats` is two alternatives).
fn subcommand_paths(args: &[Token]) -> Vec<Vec<String>> {
    let mut paths = vec![Vec::new()];
    for token in args {
        let words: Vec<&str> = token.text.split("\\|").collect();
        let is_word = |w: &str| {
            w.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                && w.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        };
        if token.quoted || !words.iter().all(|w| is_word(w)) {
            break;
        }
        paths = paths
            .iter()
            .flat_map(|p| {
                words
                    .iter()
                    .map(move |w| [p.clone(), vec![w.to_string()]].concat())
            })
            .collect();
    }
    paths
}

/// Every `--flag` and `-X` of a synopsis, without brackets or `=value`.
fn flags_shown(args: &[Token]) -> BTreeSet<String> {
    args.iter()
        .filter(|t| !t.quoted)
        .flat_map(|t| t.text.split("\\|").map(str::to_string).collect::<Vec<_>>())
        .map(|t| {
            t.trim_matches(['[', ']'])
                .split('=')
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .filter(|t| {
            t.starts_with('-')
                && t != "--"
                && t.len() > 1
                && t.chars()
                    .nth(1)
                    .is_some_and(|c| c == '-' || c.is_ascii_alphabetic())
        })
        .collect()
}

/// `orderpipe ARGS`, its exit status and its output.
fn orderpipe(args: &[String]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_orderpipe"))
        .args(args)
        .env_remove("ORDERPIPE_CONFIG")
        .output()
        .expect("orderpipe runs");
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

/// Whether `help` (clap's `--help` text) lists `flag`.
fn help_lists(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(i, _)| {
        let before = help[..i].chars().last();
        let after = help[i + flag.len()..].chars().next();
        before.is_none_or(|c| c.is_whitespace())
            && after.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
    })
}

/// The targets a Makefile defines (`name:` at the start of a line).
fn make_targets(makefile: &str) -> BTreeSet<String> {
    makefile
        .lines()
        .filter(|l| !l.starts_with(['\t', '#', ' ', '.']))
        .filter_map(|l| {
            l.split_once(':')
                .filter(|(_, rest)| !rest.starts_with('='))
                .map(|(names, _)| names)
        })
        .flat_map(|names| {
            names
                .split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|n| !n.contains(['$', '=', '%']))
        .collect()
}

/// What is wrong with one shown line, if anything.
fn problems(shown: &Shown, check: &Check, targets: &BTreeSet<String>) -> Vec<String> {
    let at = |what: String| format!("{} `{}`: {what}", shown.place, shown.text);
    match check {
        Check::Make(names) => names
            .iter()
            .filter(|n| !targets.contains(*n))
            .map(|n| at(format!("no target `{n}` in the Makefile")))
            .collect(),
        Check::Cli(args) if !args.iter().any(is_synopsis) => {
            // Concrete: clap parses it as written; --help stops before running.
            let mut argv: Vec<String> = args.iter().map(|t| t.text.clone()).collect();
            argv.push("--help".into());
            match orderpipe(&argv) {
                (true, _) => Vec::new(),
                (false, out) => vec![at(format!("`orderpipe {}` fails:\n{out}", argv.join(" ")))],
            }
        }
        Check::Cli(args) => {
            let flags = flags_shown(args);
            let mut found = Vec::new();
            for path in subcommand_paths(args) {
                let argv: Vec<String> =
                    path.iter().cloned().chain(["--help".to_string()]).collect();
                let (ok, help) = orderpipe(&argv);
                if !ok {
                    found.push(at(format!("`orderpipe {}` fails:\n{help}", argv.join(" "))));
                    continue;
                }
                for flag in flags.iter().filter(|f| !help_lists(&help, f)) {
                    found.push(at(format!(
                        "`{flag}` is not a flag of `orderpipe {}`",
                        path.join(" ")
                    )));
                }
            }
            found
        }
    }
}

/// Every problem of every command line in `documents`.
fn all_problems(documents: &[(String, String)], makefile: &str) -> (usize, Vec<String>) {
    let targets = make_targets(makefile);
    let mut checked = 0;
    let mut found = Vec::new();
    for (name, text) in documents {
        for shown in command_lines(name, text) {
            if let Some(check) = check_of(&shown.text) {
                if std::env::var_os("README_CHECK_DEBUG").is_some() {
                    eprintln!("{} {:?}", shown.place, check);
                }
                checked += 1;
                found.extend(problems(&shown, &check, &targets));
            }
        }
    }
    (checked, found)
}

#[test]
fn every_command_line_the_readme_shows_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let documents: Vec<(String, String)> = documents()
        .into_iter()
        .map(|p| {
            let name = p.strip_prefix(root).unwrap_or(&p).display().to_string();
            (
                name,
                std::fs::read_to_string(&p).expect("readable markdown"),
            )
        })
        .collect();
    let makefile = std::fs::read_to_string(root.join("Makefile")).unwrap();
    let (checked, found) = all_problems(&documents, &makefile);
    // The README shows dozens; finding few means the extraction broke.
    assert!(
        checked >= 40,
        "only {checked} command lines found in {documents:?}",
        documents = documents.iter().map(|d| &d.0).collect::<Vec<_>>()
    );
    assert!(
        found.is_empty(),
        "{} of {checked} command lines do not exist:\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn the_check_catches_an_unknown_subcommand_flag_value_and_target() {
    let markdown = "Run `orderpipe demo --events 5` or\n`orderpipe dlq\nreplay --id 42 --dry-run`.\n\n\
                    | `orderpipe relay [--batch-size N] [--no-such-flag]` | x |\n\n\
                    ```sh\norderpipe frobnicate   # comment\nmake run && make no-such-target\n\
                    cargo run --bin orderpipe -- dlq list --since yesterday-ish\n```\n\n\
                    ```\norderpipe output lines are not commands\n```\n";
    let (checked, found) = all_problems(
        &[("X.md".into(), markdown.into())],
        "run: x\n\t$(X)\ntest:\n",
    );
    assert_eq!(checked, 7, "{found:#?}");
    let expect = [
        "X.md:1 `orderpipe demo --events 5`",
        "X.md:5 `orderpipe relay [--batch-size N] [--no-such-flag]`: `--no-such-flag`",
        "X.md:8 `orderpipe frobnicate`",
        "X.md:9 `make no-such-target`",
        "X.md:10 `cargo run --bin orderpipe -- dlq list --since yesterday-ish`",
    ];
    assert_eq!(found.len(), expect.len(), "{found:#?}");
    for (problem, start) in found.iter().zip(expect) {
        assert!(
            problem.starts_with(start),
            "{problem}\n  should start with {start}"
        );
    }
}
