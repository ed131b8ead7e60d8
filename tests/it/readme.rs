//! Every command line the README and `docs/*.md` show exists: each
//! `orderpipe ...` line in a `sh` block, in a `console` block (after its
//! `$ ` prompt) or in inline code, `cargo run ... -- ARGS` lines, and
//! `make TARGET` lines; leading `NAME=value` assignments and trailing
//! redirections are the shell's, not the command's. No stack needed.
//!
//! A concrete line (`orderpipe dlq replay --id 42 --dry-run`) runs through
//! clap as written, plus `--help`: an unknown subcommand, flag or bad value
//! fails the parse. A synopsis (`orderpipe relay [--batch-size 500]`,
//! `--handler H[,H...]`, `key\|none`) cannot run as written, so its
//! subcommand's `--help` must succeed and list every `--flag` shown.
//! `README_CHECK_DEBUG=1` prints every line found and how it is checked.
//!
//! Also: every relative link of those pages reaches an existing file and,
//! for a `#fragment` into markdown, a heading of that page (GitHub's anchor
//! rules); and `docs/configuration.md` names every key of
//! `src/config/defaults.toml` and every top-level value of the chart.

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

/// What a fenced block holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    /// ```sh, bash, shell: every line is a command.
    Shell,
    /// ```console: lines after a `$ ` prompt are commands, the rest output.
    Console,
    /// Anything else (output, TOML, Mermaid): no commands.
    Other,
}

/// Shell command lines of `markdown`: the lines of ```sh/bash/shell blocks
/// and the `$ ` lines of ```console blocks (continuations joined, prompts
/// and `#` comments removed, split at `;`, `&&`, `||` and pipes) and every
/// inline code span.
fn command_lines(name: &str, markdown: &str) -> Vec<Shown> {
    let mut shown = Vec::new();
    let mut fence: Option<Block> = None; // inside a fenced block
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
                fence = Some(match language.as_str() {
                    "sh" | "bash" | "shell" => Block::Shell,
                    "console" => Block::Console,
                    _ => Block::Other,
                });
            }
            continue;
        }
        match fence {
            Some(Block::Console) if pending.is_empty() && !trimmed.starts_with("$ ") => {}
            Some(shell @ (Block::Shell | Block::Console)) => {
                let line = match shell {
                    Block::Console if pending.is_empty() => &trimmed[2..],
                    _ => trimmed.strip_prefix("$ ").unwrap_or(trimmed),
                };
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
            Some(Block::Other) => {}
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

/// The words of a command as the program sees them: without leading
/// `NAME=value` assignments, and without a redirection (`> file`, `2>&1`,
/// `< file`) or a trailing `&` and what follows it.
fn program_words(words: Vec<Token>) -> Vec<Token> {
    let assignment = |t: &Token| {
        t.text.split_once('=').is_some_and(|(name, _)| {
            name.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    };
    let shell = |t: &Token| {
        let s = t.text.trim_start_matches(|c: char| c.is_ascii_digit());
        // `<ID>` is a placeholder, not an input redirection.
        let input = s.starts_with('<') && !s.ends_with('>');
        !t.quoted && (s.starts_with('>') || input || s.starts_with("&>") || t.text == "&")
    };
    words
        .into_iter()
        .skip_while(assignment)
        .take_while(|t| !shell(t))
        .collect()
}

fn check_of(text: &str) -> Option<Check> {
    let words = program_words(tokens(text));
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
    // Options before the subcommand are global ones, each with its value
    // (`orderpipe --log-level off consume ...`).
    let mut args = args;
    while let Some(first) = args
        .first()
        .filter(|t| !t.quoted && t.text.starts_with('-'))
    {
        let width = if first.text.contains('=') { 1 } else { 2 };
        args = &args[width.min(args.len())..];
    }
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
            .filter(|n| match n.split_once('*') {
                // `bench-*`: a pattern, which some target must match.
                Some((head, tail)) => !targets.iter().any(|t| {
                    t.len() >= head.len() + tail.len() && t.starts_with(head) && t.ends_with(tail)
                }),
                None => !targets.contains(*n),
            })
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

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces
/// as `-` (`` `orderpipe api`: the reference `` -> `orderpipe-api-the-reference`).
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of `markdown`'s headings (outside code blocks); a repeated
/// heading gets `-1`, `-2`, ... as on GitHub.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut in_block = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        let Some(text) = line.strip_prefix('#') else {
            continue;
        };
        let text = text.trim_start_matches('#');
        if in_block || !text.starts_with(' ') {
            continue;
        }
        let base = slug(text);
        let mut anchor = base.clone();
        let mut n = 0;
        while found.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        found.insert(anchor);
    }
    found
}

/// Every link target `[text](target)` of `markdown` outside code, with its
/// line number.
fn link_targets(markdown: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut in_block = false;
    let mut in_code = false; // an inline code span may wrap across lines
    for (index, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            in_code = false;
            continue;
        }
        if in_block {
            continue;
        }
        if line.trim().is_empty() {
            in_code = false;
        }
        let mut prose = String::new();
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
                prose.push(' ');
            } else {
                prose.push(if in_code { ' ' } else { c });
            }
        }
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let tail = &rest[at + 2..];
            let Some(end) = tail.find(')') else { break };
            found.push((index + 1, tail[..end].trim().to_string()));
            rest = &tail[end..];
        }
    }
    found
}

/// What is wrong with the relative links of `documents` (name relative to
/// `root`, text): a file that does not exist, or a `#fragment` that is no
/// heading of the markdown page it points into.
fn link_problems(root: &Path, documents: &[(String, String)]) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut found = Vec::new();
    for (name, text) in documents {
        let dir = root
            .join(name)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        for (line, target) in link_targets(text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let file = if path.is_empty() {
                root.join(name)
            } else {
                dir.join(path)
            };
            let at = format!("{name}:{line} ({target})");
            let page = if path.is_empty() {
                Some(text.clone())
            } else if !file.exists() {
                found.push(format!("{at}: no file {}", file.display()));
                continue;
            } else if file.extension().is_some_and(|x| x == "md") {
                std::fs::read_to_string(&file).ok()
            } else {
                None
            };
            if let (false, Some(page)) = (fragment.is_empty(), page)
                && !anchors(&page).contains(fragment)
            {
                found.push(format!("{at}: no heading with the anchor #{fragment}"));
            }
        }
    }
    (checked, found)
}

/// The dotted keys of a TOML table's leaves (an empty table is a leaf).
fn setting_keys(table: &toml::Table, prefix: &str, keys: &mut Vec<String>) {
    for (key, value) in table {
        let path = format!("{prefix}{key}");
        match value {
            toml::Value::Table(inner) if !inner.is_empty() => {
                setting_keys(inner, &format!("{path}."), keys)
            }
            _ => keys.push(path),
        }
    }
}

/// The settings of `defaults` (TOML) and the top-level chart values of
/// `values` (YAML) that `reference` does not name in code: a setting as
/// `` `a.b.c` `` (or `` `a.*.c` `` for one of several same-shaped sections),
/// a chart value as `` `name`` followed by `` ` ``, `.` or `[`.
fn unnamed_settings(defaults: &str, values: &str, reference: &str) -> Vec<String> {
    let table: toml::Table = defaults.parse().expect("defaults.toml parses");
    let mut keys = Vec::new();
    setting_keys(&table, "", &mut keys);
    let mut missing: Vec<String> = keys
        .into_iter()
        .filter(|key| {
            let parts: Vec<&str> = key.split('.').collect();
            let starred =
                (parts.len() > 2).then(|| [&[parts[0], "*"][..], &parts[2..]].concat().join("."));
            !reference.contains(&format!("`{key}`"))
                && !starred.is_some_and(|s| reference.contains(&format!("`{s}`")))
        })
        .map(|key| format!("setting `{key}` (src/config/defaults.toml)"))
        .collect();
    let top_level = values.lines().filter_map(|l| {
        let (name, _) = l.split_once(':')?;
        (!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric())).then_some(name)
    });
    for name in top_level {
        if !["`", ".", "["]
            .iter()
            .any(|after| reference.contains(&format!("`{name}{after}")))
        {
            missing.push(format!("chart value `{name}` (helm/orderpipe/values.yaml)"));
        }
    }
    missing
}

/// README.md and `docs/*.md` as (path relative to the repository, text).
fn read_documents() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    documents()
        .into_iter()
        .map(|p| {
            let name = p.strip_prefix(root).unwrap_or(&p).display().to_string();
            (
                name,
                std::fs::read_to_string(&p).expect("readable markdown"),
            )
        })
        .collect()
}

/// `found` holds exactly one problem per `expected` beginning, in order.
fn assert_problems(found: &[String], expected: &[&str]) {
    assert_eq!(found.len(), expected.len(), "{found:#?}");
    for (problem, start) in found.iter().zip(expected) {
        assert!(
            problem.starts_with(start),
            "{problem}\n  should start with {start}"
        );
    }
}

#[test]
fn every_relative_link_of_the_readme_and_docs_reaches_its_file_and_heading() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let documents = read_documents();
    let (checked, found) = link_problems(root, &documents);
    // The README links to every docs page, and the pages to each other.
    assert!(checked >= 10, "only {checked} relative links found");
    assert!(
        found.is_empty(),
        "{} of {checked} links lead nowhere:\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn the_link_check_catches_a_missing_file_and_a_missing_heading() {
    let dir = std::env::temp_dir().join(format!("readme-links-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    let page =
        "# Page\n\n## `orderpipe api`: the reference order service\n\n## Twice\n\n## Twice\n";
    std::fs::write(dir.join("docs/page.md"), page).unwrap();
    let readme = "See [api](docs/page.md#orderpipe-api-the-reference-order-service),\n\
                  [second](docs/page.md#twice-1), [top](#readme) and [web](https://example.com).\n\
                  `[not a link](nowhere.md)`\n\n\
                  [gone](docs/gone.md) and [no heading](docs/page.md#twice-2)\n\n\
                  ```\n[in a block](nowhere.md)\n```\n\n# Readme\n";
    let (checked, found) = link_problems(&dir, &[("README.md".into(), readme.into())]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(checked, 5, "{found:#?}");
    assert_problems(
        &found,
        &[
            "README.md:5 (docs/gone.md): no file",
            "README.md:5 (docs/page.md#twice-2): no heading",
        ],
    );
}

#[test]
fn the_configuration_reference_names_every_setting_and_chart_value() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
    let missing = unnamed_settings(
        &read("src/config/defaults.toml"),
        &read("helm/orderpipe/values.yaml"),
        &read("docs/configuration.md"),
    );
    assert!(
        missing.is_empty(),
        "docs/configuration.md does not name:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_settings_check_catches_an_unnamed_setting_and_chart_value() {
    let defaults = "[consumer]\nbatch_size = 500\noptions = {}\n\
                    [topics.a]\nname = \"a\"\n[topics.b]\nname = \"b\"\npartitions = 1\n";
    let values = "image:\n  tag: x\nkeda:\n  enabled: false\n";
    let reference =
        "| `consumer.batch_size` | `topics.*.name` | `topics.b.partitions` | `image.tag` |";
    let missing = unnamed_settings(defaults, values, reference);
    assert_eq!(
        missing,
        [
            "setting `consumer.options` (src/config/defaults.toml)",
            "chart value `keda` (helm/orderpipe/values.yaml)"
        ],
    );
}

#[test]
fn every_command_line_the_readme_shows_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let documents = read_documents();
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

#[test]
fn console_output_shell_assignments_and_redirections_are_not_the_command() {
    let markdown = "```console\n\
                    $ ORDERPIPE_CHAOS__PERMANENT_ORDERS='[3]' orderpipe lag --no-such-flag > out.txt 2>&1\n\
                    orderpipe frobnicate: output, not a command\n\
                    $ ORDERPIPE_X=1 orderpipe config --output toml > orderpipe.toml\n\
                    ```\n\n`orderpipe dlq show <ID>`\n";
    let (checked, found) = all_problems(&[("X.md".into(), markdown.into())], "");
    assert_eq!(checked, 3, "{found:#?}");
    assert_problems(
        &found,
        &[
            "X.md:2 `ORDERPIPE_CHAOS__PERMANENT_ORDERS='[3]' orderpipe lag --no-such-flag > out.txt 2>&1`",
        ],
    );
}

#[test]
fn global_options_before_the_subcommand_and_target_patterns_are_understood() {
    let markdown = "`orderpipe --log-level off consume --group G --handler H --ordering key`\n\n\
                    `orderpipe --log-level off consume --group G --no-such-flag`\n\n\
                    `make bench-*` and `make nope-*`\n";
    let (checked, found) = all_problems(
        &[("X.md".into(), markdown.into())],
        "bench-produce: x\nbench-dlq:\n",
    );
    assert_eq!(checked, 4, "{found:#?}");
    assert_problems(
        &found,
        &[
            "X.md:3 `orderpipe --log-level off consume --group G --no-such-flag`: `--no-such-flag` is not a flag of `orderpipe consume`",
            "X.md:5 `make nope-*`: no target `nope-*`",
        ],
    );
}
