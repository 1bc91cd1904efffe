//! `--prefix-file FILE` (ds4): earlier turns to start the conversation from, written as
//! `USER:` / `ASSISTANT:` blocks. A marker counts only at the start of a line; the file starts with
//! USER, alternates, and ends with ASSISTANT (complete pairs).
use ds4_tokenizer::chat::Message;

const USER: &str = "USER:";
const ASSISTANT: &str = "ASSISTANT:";

/// The turns of a prefix file, in order.
pub fn parse(text: &str) -> Result<Vec<Message>, String> {
    let mut turns: Vec<(bool, String)> = Vec::new(); // (is_user, content)
    for line in text.split_inclusive('\n') {
        let (user, rest) = if let Some(r) = line.strip_prefix(USER) {
            (Some(true), r)
        } else if let Some(r) = line.strip_prefix(ASSISTANT) {
            (Some(false), r)
        } else {
            (None, line)
        };
        match (user, turns.last_mut()) {
            (Some(u), _) => turns.push((u, rest.strip_prefix(' ').unwrap_or(rest).to_string())),
            (None, Some(t)) => t.1.push_str(rest),
            (None, None) if rest.trim().is_empty() => {}
            (None, None) => return Err("the prefix file must start with a USER: line".into()),
        }
    }
    for (i, (user, _)) in turns.iter().enumerate() {
        if *user != (i % 2 == 0) {
            return Err(format!("turn {}: USER: and ASSISTANT: must alternate, starting with USER:", i + 1));
        }
    }
    if turns.is_empty() || !turns.len().is_multiple_of(2) {
        return Err("the prefix file must hold complete USER:/ASSISTANT: pairs (it ends with ASSISTANT:)".into());
    }
    Ok(turns
        .into_iter()
        .map(|(user, c)| {
            let c = c.trim_end_matches(['\n', '\r']).to_string();
            if user { Message::user(c) } else { Message::assistant(c) }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ds4_tokenizer::chat::Role;

    #[test]
    fn pairs_with_multiline_content() {
        let t = parse("USER: Hi\nthere\nASSISTANT: Hello.\n  USER: is not a marker here\nUSER:Bye\nASSISTANT: Ciao\n").unwrap();
        let got: Vec<(Role, &str)> = t.iter().map(|m| (m.role, m.content.as_str())).collect();
        assert_eq!(got, [(Role::User, "Hi\nthere"), (Role::Assistant, "Hello.\n  USER: is not a marker here"), (Role::User, "Bye"), (Role::Assistant, "Ciao")]);
    }

    #[test]
    fn incomplete_or_out_of_order_files_are_refused() {
        assert!(parse("").is_err());
        assert!(parse("hello\nUSER: x\nASSISTANT: y\n").is_err());
        assert!(parse("USER: x\n").is_err());
        assert!(parse("ASSISTANT: y\nUSER: x\n").is_err());
        assert!(parse("USER: a\nUSER: b\nASSISTANT: c\nASSISTANT: d\n").is_err());
    }
}
