//! How the README and docs/ read: prose wrapped at 100 columns, no paragraph
//! or list item over 8 lines, a README of at most 200 lines. `wrap` shapes
//! the prose `cargo xtask docs` writes from results/; `problems` is what the
//! pages' unit test checks, so a wall of text cannot come back unnoticed.

/// The widest a line of prose may be (tables, code and headings may be wider).
pub const WIDTH: usize = 100;
/// The longest a paragraph or a single list item may run.
#[cfg(test)]
pub const MAX_PARAGRAPH_LINES: usize = 8;
/// The README is a front page, not a manual.
#[cfg(test)]
pub const README_MAX_LINES: usize = 200;

/// A line that is not prose: a table row, a heading, an HTML comment.
fn is_structure(line: &str) -> bool {
    line.starts_with('|') || line.starts_with('#') || line.starts_with('<')
}

/// The indent of a list item's continuation lines, if `line` starts one.
fn item_indent(line: &str) -> Option<usize> {
    let text = line.trim_start();
    let lead = line.len() - text.len();
    if text.starts_with("- ") || text.starts_with("* ") {
        return Some(lead + 2);
    }
    let digits = text.chars().take_while(char::is_ascii_digit).count();
    (digits > 0 && text[digits..].starts_with(". ")).then_some(lead + digits + 2)
}

/// One line of prose broken at spaces so that no piece passes `WIDTH`
/// (a single word longer than that stays whole); list items continue under
/// their text.
fn wrap_line(line: &str, out: &mut String) {
    let indent = item_indent(line).unwrap_or(line.len() - line.trim_start().len());
    let mut current = String::new();
    for word in line.split(' ') {
        if word.is_empty() && !current.trim().is_empty() {
            continue;
        }
        let candidate_len = current.len() + usize::from(!current.is_empty()) + word.len();
        if !current.trim().is_empty() && candidate_len > WIDTH {
            out.push_str(current.trim_end());
            out.push('\n');
            current = " ".repeat(indent);
            current.push_str(word);
        } else {
            if !current.is_empty() && !current.ends_with(' ') {
                current.push(' ');
            }
            current.push_str(word);
        }
    }
    out.push_str(current.trim_end());
    out.push('\n');
}

/// `text` with every prose line longer than `WIDTH` wrapped; code blocks,
/// tables, headings and comments are kept as they are.
pub fn wrap(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_code = false;
    for line in text.split_inclusive('\n') {
        let bare = line.strip_suffix('\n').unwrap_or(line);
        if bare.starts_with("```") {
            in_code = !in_code;
        }
        if in_code || bare.starts_with("```") || is_structure(bare) || bare.len() <= WIDTH {
            out.push_str(line);
            continue;
        }
        wrap_line(bare, &mut out);
        if !line.ends_with('\n') {
            out.pop();
        }
    }
    out
}

/// What makes `page` (named `name` in the messages) a wall: prose lines over
/// `WIDTH` and paragraphs or list items over `MAX_PARAGRAPH_LINES`.
#[cfg(test)]
pub fn problems(name: &str, page: &str) -> Vec<String> {
    let mut found = Vec::new();
    let (mut in_code, mut run, mut run_start) = (false, 0, 0);
    for (index, line) in page.lines().enumerate() {
        let number = index + 1;
        if line.starts_with("```") {
            in_code = !in_code;
            run = 0;
            continue;
        }
        if in_code {
            continue;
        }
        if line.trim().is_empty() || is_structure(line) {
            run = 0;
            continue;
        }
        if item_indent(line).is_some() {
            run = 0;
        }
        if run == 0 {
            run_start = number;
        }
        run += 1;
        if run == MAX_PARAGRAPH_LINES + 1 {
            found.push(format!(
                "{name}:{run_start}: a paragraph or list item of more than \
                 {MAX_PARAGRAPH_LINES} lines: split it, or make it a list or a table"
            ));
        }
        if line.chars().count() > WIDTH && line.contains(' ') {
            found.push(format!(
                "{name}:{number}: {} characters of prose (at most {WIDTH}): wrap it",
                line.chars().count()
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_breaks_prose_and_keeps_tables_code_and_short_lines() {
        let long = format!("{} end", "word ".repeat(30).trim_end());
        let item = format!("- {long}");
        let table = format!("| {} |", "cell ".repeat(30));
        let code = format!("```\n{long}\n```\n");
        let text = format!("short\n{long}\n{item}\n{table}\n{code}");
        let wrapped = wrap(&text);
        assert!(wrapped.starts_with("short\n"));
        assert!(wrapped.contains(&table));
        assert!(wrapped.contains(&code));
        for line in wrapped
            .lines()
            .filter(|l| !l.starts_with('|') && !l.contains("end"))
        {
            assert!(line.len() <= WIDTH, "{line}");
        }
        // The item's continuation lines sit under its text.
        let after_item = wrapped.split("- word").nth(1).expect("the item is kept");
        assert!(
            after_item
                .lines()
                .nth(1)
                .is_some_and(|l| l.starts_with("  word"))
        );
        assert_eq!(wrap(&wrapped), wrapped, "wrapping twice changes nothing");
        assert!(
            problems("t", &wrapped).is_empty(),
            "{:?}",
            problems("t", &wrapped)
        );
    }

    #[test]
    fn problems_finds_walls_and_long_lines_but_not_tables_or_code() {
        let wall = "a line\n".repeat(MAX_PARAGRAPH_LINES + 1);
        let found = problems("p", &wall);
        assert_eq!(found.len(), 1);
        assert!(found[0].starts_with("p:1: a paragraph"), "{found:?}");
        let items = "- one\n  more\n".repeat(MAX_PARAGRAPH_LINES);
        assert!(
            problems("p", &items).is_empty(),
            "short items are not a wall"
        );
        let long = format!("{}\n", "x ".repeat(WIDTH));
        assert!(problems("p", &long)[0].contains("characters of prose"));
        let fenced = format!("```\n{long}{wall}```\n");
        assert!(problems("p", &fenced).is_empty());
        assert!(problems("p", &format!("| {long}")).is_empty());
    }

    /// The committed README and docs pages read as pages, not walls.
    #[test]
    fn the_readme_and_docs_have_no_walls() -> anyhow::Result<()> {
        let root = crate::util::root();
        let readme = std::fs::read_to_string(root.join("README.md"))?;
        let mut found = problems("README.md", &readme);
        let lines = readme.lines().count();
        if lines > README_MAX_LINES {
            found.push(format!(
                "README.md: {lines} lines (at most {README_MAX_LINES})"
            ));
        }
        for entry in std::fs::read_dir(root.join("docs"))? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "md") {
                let name = path.strip_prefix(&root)?.display().to_string();
                found.extend(problems(&name, &std::fs::read_to_string(&path)?));
            }
        }
        assert!(found.is_empty(), "{}", found.join("\n"));
        Ok(())
    }
}
