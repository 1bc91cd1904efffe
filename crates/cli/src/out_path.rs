//! Files the command line names for output, checked before any weight is read: a mistyped directory
//! or a directory given for a file then costs nothing, instead of failing after a whole generation.
use std::path::Path;

/// `path` can be created or overwritten: its directory exists and it is not itself a directory.
pub fn check_output(path: &Path) -> Result<(), String> {
    if path.as_os_str().is_empty() {
        return Err("needs a file name".into());
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(format!("{}: is a directory, not a file", path.display())),
        Ok(_) => Ok(()),
        Err(_) if !dir.is_dir() => Err(format!("{}: directory {} does not exist", path.display(), dir.display())),
        Err(_) => Ok(()),
    }
}

/// As [`check_output`], for a file that is written beside `path` and renamed over it (the KV cache
/// file): an existing `path` must be a regular file, never a device, FIFO or socket the rename would
/// replace.
pub fn check_replaced(path: &Path) -> Result<(), String> {
    check_output(path)?;
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(format!("{}: exists and is not a regular file", path.display())),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_missing_parents_and_special_files_are_refused() {
        let d = std::env::temp_dir().join(format!("ds4-out-path-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        assert!(check_output(&d.join("new.json")).is_ok());
        assert!(check_output(Path::new("relative-new-file.json")).is_ok());
        assert!(check_output(&d).unwrap_err().contains("is a directory"));
        assert!(check_output(&d.join("nodir/x.json")).unwrap_err().contains("does not exist"));
        assert!(check_output(Path::new("")).is_err());
        let f = d.join("existing.kv");
        std::fs::write(&f, b"x").unwrap();
        assert!(check_replaced(&f).is_ok());
        assert!(check_output(Path::new("/dev/null")).is_ok(), "written in place: a device is fine");
        assert!(check_replaced(Path::new("/dev/null")).unwrap_err().contains("not a regular file"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
