//! When the server applies the loaded directional steering (`--dir-steering-policy`, as ds4-server):
//! `final-answer` steers the tokens generated after the reasoning ends (every generated token of a
//! request without thinking), `decoding` every generated token, `always` the prompt's prefill too,
//! `off` nothing. The first generated token comes from the prompt's logits, so it is steered only by
//! `always`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SteerPolicy {
    #[default]
    FinalAnswer,
    Decoding,
    Always,
    Off,
}

impl SteerPolicy {
    /// From the flag's value (clap admits only these names; anything else is `off`).
    pub fn parse(s: &str) -> Self {
        match s {
            "final-answer" => Self::FinalAnswer,
            "decoding" => Self::Decoding,
            "always" => Self::Always,
            _ => Self::Off,
        }
    }

    /// Whether a prompt's prefill is steered.
    pub fn prefill(self) -> bool { self == Self::Always }

    /// Whether the decode step that feeds a generated token is steered, `reasoning` telling whether
    /// the request is still inside its reasoning after that token.
    pub fn decode(self, reasoning: bool) -> bool {
        match self {
            Self::FinalAnswer => !reasoning,
            Self::Decoding | Self::Always => true,
            Self::Off => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SteerPolicy as P;

    #[test]
    fn each_policy_steers_its_phases() {
        let phases = |p: P| (p.prefill(), p.decode(true), p.decode(false));
        assert_eq!(phases(P::parse("final-answer")), (false, false, true));
        assert_eq!(phases(P::parse("decoding")), (false, true, true));
        assert_eq!(phases(P::parse("always")), (true, true, true));
        assert_eq!(phases(P::parse("off")), (false, false, false));
        assert_eq!(P::default(), P::FinalAnswer);
    }
}
