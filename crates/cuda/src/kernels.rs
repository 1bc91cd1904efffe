pub const SRC: &str = "";
