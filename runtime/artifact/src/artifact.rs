//! A signed precompiled policy: a component compiled for one platform (wasmtime's
//! `Component::serialize`), and an ed25519 signature over what it is. Deserializing runs machine
//! code, so a node deserializes nothing that its trusted key did not sign for it.
//!
//! Layout: `MAGIC`, the header's length (u32, little-endian), the header (JSON), the signature
//! (64 bytes, over `DOMAIN` + the header), the payload. The header names the payload's SHA-256,
//! the source component's SHA-256 (a job's `sha256` pin names the component, compiled or not),
//! the platform and the engine fingerprint it was compiled for.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::signing::{SigningKey, TrustedKey};

/// How a signed artifact begins.
pub const MAGIC: &[u8; 8] = b"PRNLSIG1";
/// What the signature covers before the header: a signature made for anything else never
/// verifies as an artifact's.
const DOMAIN: &[u8] = b"perennial precompiled policy v1\0";
const HEADER_MAX: usize = 4 << 10;
const SIGNATURE_LEN: usize = 64;

/// What an artifact says it is; signed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Header {
    /// SHA-256 of the source component.
    pub component_sha256: String,
    /// Its size in bytes.
    pub component_size: u64,
    /// What it was compiled for: a target triple, or `pulley32` / `pulley64`.
    pub platform: String,
    /// The engine's settings it was compiled for ([`crate::target::fingerprint`]).
    pub fingerprint: String,
    /// SHA-256 of the payload.
    pub artifact_sha256: String,
    /// The key that signed it ([`TrustedKey::id`]): for messages only; the signature decides.
    pub signer: String,
}

/// An artifact whose signature, digest, platform and fingerprint have all been checked.
#[derive(Debug)]
pub struct Verified<'a> {
    pub header: Header,
    pub payload: &'a [u8],
}

/// Whether `bytes` are a signed artifact (rather than a component).
pub fn is_artifact(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// The SHA-256 of `bytes`, in lower-case hex (how pins and headers write it).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Signs `payload`, compiled from a component of `component_size` bytes with SHA-256
/// `component_sha256` for `platform` and `fingerprint`.
pub fn seal(
    payload: &[u8],
    component_sha256: &str,
    component_size: u64,
    platform: &str,
    fingerprint: &str,
    key: &SigningKey,
) -> Vec<u8> {
    let header = Header {
        component_sha256: component_sha256.to_owned(),
        component_size,
        platform: platform.to_owned(),
        fingerprint: fingerprint.to_owned(),
        artifact_sha256: hex::encode(Sha256::digest(payload)),
        signer: key.trusted().id(),
    };
    let header = serde_json::to_vec(&header).unwrap_or_default();
    let signature = key.sign(&signed_message(&header));
    let mut bytes = Vec::with_capacity(MAGIC.len() + 4 + header.len() + SIGNATURE_LEN + payload.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&(header.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&header);
    bytes.extend_from_slice(&signature);
    bytes.extend_from_slice(payload);
    bytes
}

/// Checks everything an artifact claims, in the order that gives the truest reason: its form,
/// its signature by `trusted`, its payload against the signed digest, then that it was made for
/// `platform` and `fingerprint`.
pub fn open<'a>(
    bytes: &'a [u8],
    trusted: &TrustedKey,
    platform: &str,
    fingerprint: &str,
) -> Result<Verified<'a>, String> {
    let rest = bytes.strip_prefix(MAGIC.as_slice()).ok_or("it is not a signed artifact")?;
    let (length, rest) = rest.split_at_checked(4).ok_or("it is cut short (no header)")?;
    let length = u32::from_le_bytes(length.try_into().map_err(|_| "it is cut short")?) as usize;
    if length > HEADER_MAX {
        return Err(format!("its header is {length} bytes, more than an artifact's ({HEADER_MAX} at most)"));
    }
    let (header_bytes, rest) = rest.split_at_checked(length).ok_or("it is cut short (in its header)")?;
    let (signature, payload) = rest.split_at_checked(SIGNATURE_LEN).ok_or("it is cut short (in its signature)")?;
    let header = signed_header(header_bytes, signature, trusted)?;
    let actual = hex::encode(Sha256::digest(payload));
    check_payload(&header, &actual)?;
    check_made_for(&header, platform, fingerprint)?;
    Ok(Verified { header, payload })
}

/// The header, if `signature` is `trusted`'s over it.
fn signed_header(header_bytes: &[u8], signature: &[u8], trusted: &TrustedKey) -> Result<Header, String> {
    let header: Header =
        serde_json::from_slice(header_bytes).map_err(|err| format!("its header is not an artifact's: {err}"))?;
    if !trusted.verifies(&signed_message(header_bytes), signature) {
        return Err(if header.signer == trusted.id() {
            format!("its signature does not verify with the trusted key {} (altered after signing)", trusted.id())
        } else {
            format!(
                "it is signed by key {}, not by the key this node trusts ({})",
                header.signer.chars().take(32).collect::<String>(),
                trusted.id()
            )
        });
    }
    Ok(header)
}

fn check_payload(header: &Header, actual: &str) -> Result<(), String> {
    if actual != header.artifact_sha256 {
        return Err(format!(
            "its compiled code has sha256 {actual}, not the signed {} (corrupt or altered)",
            header.artifact_sha256
        ));
    }
    Ok(())
}

fn check_made_for(header: &Header, platform: &str, fingerprint: &str) -> Result<(), String> {
    if header.platform != platform {
        return Err(format!("it is compiled for {}, and this node runs {platform}", header.platform));
    }
    if header.fingerprint != fingerprint {
        return Err(format!(
            "it is compiled for engine {}, and this node's engine is {fingerprint} (another Perennial version or \
             settings: compile it again with this version)",
            header.fingerprint
        ));
    }
    Ok(())
}

/// An artifact file checked as [`open`] checks one, read in pieces (never whole in memory): its
/// header, the SHA-256 of the whole file, and its size.
pub fn open_file(
    path: &std::path::Path,
    trusted: &TrustedKey,
    platform: &str,
    fingerprint: &str,
) -> Result<(Header, String, u64), String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(|err| format!("{}: {err}", path.display()))?;
    let mut whole = Sha256::new();
    let mut read = |buffer: &mut [u8], what: &str| -> Result<(), String> {
        file.read_exact(buffer).map_err(|_| format!("it is cut short ({what})"))?;
        whole.update(&*buffer);
        Ok(())
    };
    let mut start = [0u8; 12];
    read(&mut start, "no header")?;
    if start[..8] != MAGIC[..] {
        return Err("it is not a signed artifact".into());
    }
    let length = u32::from_le_bytes([start[8], start[9], start[10], start[11]]) as usize;
    if length > HEADER_MAX {
        return Err(format!("its header is {length} bytes, more than an artifact's ({HEADER_MAX} at most)"));
    }
    let mut header_bytes = vec![0u8; length];
    read(&mut header_bytes, "in its header")?;
    let mut signature = [0u8; SIGNATURE_LEN];
    read(&mut signature, "in its signature")?;
    let header = signed_header(&header_bytes, &signature, trusted)?;
    let mut payload = Sha256::new();
    let mut size = (12 + length + SIGNATURE_LEN) as u64;
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer).map_err(|err| format!("{}: {err}", path.display()))?;
        if n == 0 {
            break;
        }
        payload.update(&buffer[..n]);
        whole.update(&buffer[..n]);
        size += n as u64;
    }
    check_payload(&header, &hex::encode(payload.finalize()))?;
    check_made_for(&header, platform, fingerprint)?;
    Ok((header, hex::encode(whole.finalize()), size))
}

fn signed_message(header: &[u8]) -> Vec<u8> {
    [DOMAIN, header].concat()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signing;

    fn key() -> SigningKey {
        let dir = tempfile::tempdir().expect("a folder");
        let (private, _) = signing::generate().expect("a key");
        std::fs::write(dir.path().join("k"), private).expect("write");
        SigningKey::from_file(&dir.path().join("k")).expect("a key")
    }

    #[test]
    fn what_is_sealed_opens_with_its_key_and_nothing_altered_does() {
        let key = key();
        let trusted = key.trusted();
        let sealed = seal(b"machine code", "c0de", 7, "aarch64-unknown-linux-gnu", "f1", &key);
        let opened = open(&sealed, &trusted, "aarch64-unknown-linux-gnu", "f1").expect("opens");
        assert_eq!(opened.payload, b"machine code");
        assert_eq!(opened.header.component_sha256, "c0de");

        let mut flipped = sealed.clone();
        *flipped.last_mut().expect("bytes") ^= 1;
        let err = open(&flipped, &trusted, "aarch64-unknown-linux-gnu", "f1").expect_err("refused");
        assert!(err.contains("corrupt or altered"), "{err}");

        let other = super::tests::key();
        let err = open(&sealed, &other.trusted(), "aarch64-unknown-linux-gnu", "f1").expect_err("refused");
        assert!(err.contains("not by the key this node trusts"), "{err}");

        let err = open(&sealed, &trusted, "x86_64-unknown-linux-gnu", "f1").expect_err("refused");
        assert!(err.contains("compiled for aarch64-unknown-linux-gnu"), "{err}");
        let err = open(&sealed, &trusted, "aarch64-unknown-linux-gnu", "f2").expect_err("refused");
        assert!(err.contains("engine f1"), "{err}");
    }

    #[test]
    fn a_file_is_checked_in_pieces_as_bytes_are() {
        let key = key();
        let trusted = key.trusted();
        let dir = tempfile::tempdir().expect("a folder");
        let path = dir.path().join("a.pcwasm");
        let payload = vec![7u8; 3 << 20];
        let sealed = seal(&payload, "c0de", 9, "pulley64", "f1", &key);
        std::fs::write(&path, &sealed).expect("write");
        let (header, digest, size) = open_file(&path, &trusted, "pulley64", "f1").expect("opens");
        assert_eq!(header, open(&sealed, &trusted, "pulley64", "f1").expect("opens").header);
        assert_eq!((digest, size), (sha256_hex(&sealed), sealed.len() as u64));
        assert_eq!(
            open_file(&path, &trusted, "pulley32", "f1").unwrap_err(),
            open(&sealed, &trusted, "pulley32", "f1").unwrap_err()
        );
        let mut altered = sealed.clone();
        let last = altered.len() - 1;
        altered[last] ^= 1;
        std::fs::write(&path, &altered).expect("write");
        let err = open_file(&path, &trusted, "pulley64", "f1").unwrap_err();
        assert!(err.contains("(corrupt or altered)"), "{err}");
        std::fs::write(&path, &sealed[..20]).expect("write");
        assert!(open_file(&path, &trusted, "pulley64", "f1").unwrap_err().contains("cut short"));
    }

    #[test]
    fn an_edited_header_is_refused_even_with_the_right_payload() {
        let key = key();
        let sealed = seal(b"code", "c0de", 4, "pulley64", "f1", &key);
        let mut edited = sealed.clone();
        let at = edited.windows(8).position(|window| window == b"pulley64").expect("the header names it");
        edited[at..at + 8].copy_from_slice(b"pulley32");
        let err = open(&edited, &key.trusted(), "pulley32", "f1").expect_err("refused");
        assert!(err.contains("altered after signing"), "{err}");
    }

    #[test]
    fn truncations_and_foreign_bytes_are_refused_not_a_panic() {
        let key = key();
        let sealed = seal(b"code", "c0de", 4, "pulley64", "f1", &key);
        for cut in 0..sealed.len() {
            assert!(open(&sealed[..cut], &key.trusted(), "pulley64", "f1").is_err(), "cut at {cut}");
        }
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        let err = open(&huge, &key.trusted(), "pulley64", "f1").expect_err("refused");
        assert!(err.contains("more than an artifact's"), "{err}");
    }
}
