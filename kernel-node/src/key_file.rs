//! Key files: one base64 ed25519 seed on disk. A seed anyone but its owner can read is a key
//! that may already be someone else's, so loading refuses a file whose mode grants group or
//! others any access, and writing creates the file 0600 from the start (never briefly wider).
//!
//! **Kubernetes Secrets.** A Secret volume's files are owned by root, mode `defaultMode`. Mount
//! the key with `defaultMode: 0400` for a node that runs as root. A node that runs as another
//! user can read a root-owned 0400 file only through a group, and that is what `fsGroup` does:
//! the kubelet then makes the files group-readable (0440) whatever `defaultMode` says, and this
//! check refuses them. For a non-root node, either copy the key in an init container into an
//! `emptyDir` owned by the node's user (`install -m 600 /secret/kernel.key /keys/kernel.key`),
//! or skip the file and pass the seed in the environment (`TALLY_KERNEL_KEY_SEED` from a
//! `secretKeyRef`).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write as _};
use std::path::{Path, PathBuf};

use crate::keys::{KeyError, KeyPair};

/// Bytes read from a key file: a base64 seed and a newline are 45; anything much longer is not
/// a key file.
pub const MAX_KEY_FILE_BYTES: u64 = 1024;

#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("key file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "key file {} is readable by group or others (mode {mode:03o}); run `chmod 600 {}`",
        path.display(),
        path.display()
    )]
    Exposed { path: PathBuf, mode: u32 },
    #[error("key file {} is {bytes} bytes; at most {MAX_KEY_FILE_BYTES} allowed", path.display())]
    TooLarge { path: PathBuf, bytes: u64 },
    #[error("key file {}: {source}", path.display())]
    Key {
        path: PathBuf,
        #[source]
        source: KeyError,
    },
}

/// Reads the key at `path`, refusing it if group or others may access it. The mode is read
/// from the opened file, so the file checked is the file read.
pub fn read_key_file(path: &Path) -> Result<KeyPair, KeyFileError> {
    let io = |source| KeyFileError::Io {
        path: path.to_owned(),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    let metadata = file.metadata().map_err(io)?;
    check_private(path, &metadata)?;
    if metadata.len() > MAX_KEY_FILE_BYTES {
        return Err(KeyFileError::TooLarge {
            path: path.to_owned(),
            bytes: metadata.len(),
        });
    }
    let mut text = String::new();
    Read::take(&mut file, MAX_KEY_FILE_BYTES)
        .read_to_string(&mut text)
        .map_err(io)?;
    KeyPair::from_seed_base64(text.trim()).map_err(|source| KeyFileError::Key {
        path: path.to_owned(),
        source,
    })
}

/// Writes `key`'s seed to a new file at `path`, mode 0600 from its creation, and syncs it.
/// Refuses to overwrite: replacing a key is an operator's decision, not a side effect.
pub fn write_key_file(path: &Path, key: &KeyPair) -> Result<(), KeyFileError> {
    let io = |source| KeyFileError::Io {
        path: path.to_owned(),
        source,
    };
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(io)?;
    file.write_all(format!("{}\n", key.seed_base64()).as_bytes())
        .map_err(io)?;
    file.sync_all().map_err(io)
}

#[cfg(unix)]
fn check_private(path: &Path, metadata: &std::fs::Metadata) -> Result<(), KeyFileError> {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::Exposed {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(())
}

/// Without Unix modes there is nothing to check here; the platform's ACLs decide.
#[cfg(not(unix))]
fn check_private(_path: &Path, _metadata: &std::fs::Metadata) -> Result<(), KeyFileError> {
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};

    use super::*;

    fn private_file(path: &Path, bytes: &[u8]) {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .expect("create");
        file.write_all(bytes).expect("write");
    }

    #[test]
    fn a_written_key_is_0600_and_reads_back() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("kernel.key");
        let key = KeyPair::from_seed(&[4; 32]);
        write_key_file(&path, &key).expect("write");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let read = read_key_file(&path).expect("read");
        assert_eq!(read.public_key(), key.public_key());
        assert!(
            matches!(write_key_file(&path, &key), Err(KeyFileError::Io { .. })),
            "an existing key is never overwritten"
        );
    }

    #[test]
    fn a_key_file_readable_by_others_is_refused_naming_the_file_and_the_fix() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("kernel.key");
        write_key_file(&path, &KeyPair::from_seed(&[5; 32])).expect("write");
        for mode in [0o644, 0o640, 0o604, 0o660] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let error = read_key_file(&path).expect_err("exposed key");
            assert!(
                matches!(error, KeyFileError::Exposed { mode: m, .. } if m == mode),
                "{error}"
            );
            let message = error.to_string();
            assert!(
                message.contains(&path.display().to_string()) && message.contains("chmod 600"),
                "{message}"
            );
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).expect("chmod");
        assert!(read_key_file(&path).is_ok(), "0400 is private");
    }

    #[test]
    fn oversized_and_garbled_key_files_are_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("big.key");
        private_file(&path, &vec![b'A'; MAX_KEY_FILE_BYTES as usize + 1]);
        assert!(matches!(
            read_key_file(&path),
            Err(KeyFileError::TooLarge { .. })
        ));
        let path = dir.path().join("garbled.key");
        private_file(&path, b"not base64!\n");
        assert!(matches!(
            read_key_file(&path),
            Err(KeyFileError::Key { .. })
        ));
    }
}
