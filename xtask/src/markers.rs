//! A generated section of a hand-written page: the text between a start and
//! an end marker line, replaced by `cargo xtask docs` while everything
//! outside the markers is kept byte for byte (the README's benchmark table,
//! docs/development.md's code map).

use anyhow::bail;

/// Where one generated section lies, named for the errors a person reads.
pub struct Section {
    /// The page that holds it, as a sentence names it ("the README").
    pub page: &'static str,
    /// What lies between the markers ("the benchmark table").
    pub what: &'static str,
    pub start: &'static str,
    pub end: &'static str,
}

impl Section {
    /// `text` with what lies between the markers replaced by `body` (which
    /// ends with a newline; it starts on the line after the start marker,
    /// and the end marker follows it).
    pub fn replace(&self, text: &str, body: &str) -> anyhow::Result<String> {
        let Section {
            page,
            what,
            start,
            end,
        } = self;
        let (Some(start_at), Some(end_at)) = (text.find(start), text.find(end)) else {
            bail!(
                "{page} lacks the lines {start} and {end} that enclose {what}: put them back where it goes"
            );
        };
        if end_at < start_at {
            bail!("{page} has {end} before {start}, which enclose {what}");
        }
        let body_start = start_at + start.len();
        Ok(format!(
            "{}\n{body}{}",
            &text[..body_start],
            &text[end_at..]
        ))
    }
}
