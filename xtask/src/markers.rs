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

/// What every generated section is held to, for its own module's tests.
#[cfg(test)]
pub mod checks {
    use super::Section;

    /// `section` replaces `body` (which ends with a newline) between its
    /// markers idempotently, keeping the rest of the page byte for byte, and
    /// refuses a page whose markers are missing or reversed with an error
    /// that names the page and both markers.
    pub fn replaces_between_its_markers(section: &Section, body: &str) -> anyhow::Result<()> {
        let (start, end) = (section.start, section.end);
        let page = format!("# t\n\nbefore\n{start}\nold\n{end}\n\nafter\n");
        let once = section.replace(&page, body)?;
        assert_eq!(
            once,
            format!("# t\n\nbefore\n{start}\n{body}{end}\n\nafter\n")
        );
        assert_eq!(section.replace(&once, body)?, once);
        for page in [
            "no markers".to_string(),
            format!("{start}\nonly the start\n"),
            format!("only the end\n{end}\n"),
            format!("{end}\nreversed\n{start}\n"),
        ] {
            let error = match section.replace(&page, body) {
                Ok(_) => panic!("accepted {page:?}"),
                Err(e) => e.to_string(),
            };
            assert!(
                error.contains(section.page) && error.contains(start) && error.contains(end),
                "{error}"
            );
        }
        Ok(())
    }
}
