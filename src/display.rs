//! Text that users control, made safe to show on someone else's terminal.
//!
//! A job's command, workdir, a refused file's name, a reason quoting a
//! field: any local user writes them, and `ptrain status` shows them to
//! everyone, root included. Raw, an ESC could retitle the reader's window
//! (`ESC ] 0 ; … BEL`), clear or rewrite the screen, or on some terminals
//! answer back keystrokes; a bidi override could make `exe.txt` read as
//! `txt.exe`. Every human-readable print site passes such text through
//! [`escape`]; JSON output does not (JSON escapes controls itself and must
//! stay exact).

use std::borrow::Cow;
use std::fmt::Write;

/// Would this character do anything to a terminal but show itself?
/// C0 controls (newline and tab included: a field is one line), DEL, C1
/// controls (U+0080..U+009F; some terminals take U+009B as CSI), the bidi
/// embeddings, overrides, isolates and marks, zero-width characters, the
/// byte order mark, and the line and paragraph separators.
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}'
                | '\u{feff}'
        )
}

/// `text` with every [`is_unsafe`] character spelled out: ASCII ones as
/// `\xNN` (ESC is `\x1b`), others as `\u{NNNN}`. Everything else, the
/// backslash included, is kept as is, so ordinary text reads unchanged.
/// Borrowed when there is nothing to escape (the common case).
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if !is_unsafe(c) {
            out.push(c);
        } else if c.is_ascii() {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_escapes_are_spelled_out() {
        assert_eq!(
            escape("a\u{1b}]0;pwn\u{7}b\u{1b}[2J"),
            r"a\x1b]0;pwn\x07b\x1b[2J"
        );
        assert_eq!(escape("x\ny\tz\r\u{7f}"), r"x\x0ay\x09z\x0d\x7f");
        assert_eq!(escape("\u{9b}31m"), r"\u{9b}31m");
        assert_eq!(escape("\u{202e}txt.exe"), r"\u{202e}txt.exe");
        assert_eq!(
            escape("a\u{2066}b\u{200b}c\u{feff}"),
            r"a\u{2066}b\u{200b}c\u{feff}"
        );
    }

    #[test]
    fn ordinary_text_is_kept_and_borrowed() {
        for text in [
            "python3 train.py --lr 0.1",
            r"sed s/\./x/",
            "données/Ünïcode/日本語",
            "",
        ] {
            assert!(
                matches!(escape(text), Cow::Borrowed(t) if t == text),
                "{text}"
            );
        }
    }
}
