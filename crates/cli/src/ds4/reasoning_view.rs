//! Shows a thinking answer as reasoning, then the answer: the reasoning indented by two spaces (and
//! dim on a terminal), a blank line, then the answer. The `<think>`/`</think>` tokens themselves are
//! never printed.
const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";
const INDENT: &str = "  ";

pub struct ReasoningView {
    reasoning: bool,
    /// Something of the reasoning has been shown (a separator is owed before the answer).
    shown: bool,
    line_start: bool,
    color: bool,
}

impl ReasoningView {
    /// `thinking`: the reply starts inside the reasoning (the prompt ended with `<think>`).
    pub fn new(thinking: bool, color: bool) -> Self { Self { reasoning: thinking, shown: false, line_start: true, color } }

    /// `<think>`: the reasoning (re)starts.
    pub fn think_start(&mut self) -> String {
        self.reasoning = true;
        self.shown = false;
        String::new()
    }

    /// `</think>`: the reasoning ends; the answer follows after a blank line.
    pub fn think_end(&mut self) -> String {
        let mut out = self.close();
        if self.shown {
            out.push_str(if self.line_start { "\n" } else { "\n\n" });
        }
        self.reasoning = false;
        self.line_start = true;
        out
    }

    /// Text of the reply as it streams.
    pub fn text(&mut self, piece: &str) -> String {
        if !self.reasoning {
            if let Some(c) = piece.chars().last() {
                self.line_start = c == '\n';
            }
            return piece.to_string();
        }
        let mut out = String::new();
        for c in piece.chars() {
            if !self.shown {
                if self.color {
                    out.push_str(DIM);
                }
                self.shown = true;
            }
            if self.line_start && c != '\n' {
                out.push_str(INDENT);
            }
            self.line_start = c == '\n';
            out.push(c);
        }
        out
    }

    /// End of the reply: restores the terminal colour when it stopped inside the reasoning.
    pub fn finish(&mut self) -> String {
        let out = self.close();
        self.reasoning = false;
        out
    }

    fn close(&mut self) -> String {
        if self.reasoning && self.shown && self.color {
            RESET.to_string()
        } else {
            String::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(thinking: bool, color: bool, parts: &[&str]) -> String {
        let mut v = ReasoningView::new(thinking, color);
        let mut s = String::new();
        for p in parts {
            s += &match *p {
                "</think>" => v.think_end(),
                "<think>" => v.think_start(),
                t => v.text(t),
            };
        }
        s + &v.finish()
    }

    #[test]
    fn reasoning_is_indented_and_set_apart() {
        assert_eq!(show(true, false, &["Let me", " see.\nOk", "</think>", "Hi!"]), "  Let me see.\n  Ok\n\nHi!");
        assert_eq!(show(true, true, &["a", "</think>", "b"]), "\x1b[2m  a\x1b[0m\n\nb");
        assert_eq!(show(true, false, &["</think>", "b"]), "b", "empty reasoning: no separator");
        assert_eq!(show(false, true, &["plain"]), "plain");
        assert_eq!(show(true, true, &["cut"]), "\x1b[2m  cut\x1b[0m", "interrupted inside the reasoning");
    }
}
