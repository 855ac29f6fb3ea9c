//! The ed25519 keys that sign precompiled policies: the signing key (a PKCS#8 private key, as
//! `perennial plugin keygen` or `openssl genpkey -algorithm ed25519` writes it) and the key a
//! node trusts (its public half, a PEM `PUBLIC KEY`).

use std::path::Path;

use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{PrivatePkcs8KeyDer, SubjectPublicKeyInfoDer};
use sha2::{Digest as _, Sha256};

/// The DER of an ed25519 SubjectPublicKeyInfo before its 32 key bytes (RFC 8410).
const SPKI_PREFIX: [u8; 12] = [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];
/// The most a key file may be: a key is a few hundred bytes.
const KEY_FILE_MAX: u64 = 16 << 10;

/// A key that signs artifacts.
pub struct SigningKey {
    pair: Ed25519KeyPair,
}

/// The key a node trusts: only what it signed is ever deserialized.
#[derive(Clone, Debug)]
pub struct TrustedKey {
    public: [u8; 32],
}

impl SigningKey {
    /// Reads a PEM `PRIVATE KEY` (PKCS#8, v1 or v2) from `path`.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let text = read_key_file(path)?;
        let der = PrivatePkcs8KeyDer::from_pem_slice(&text)
            .map_err(|err| format!("{}: not a PEM PRIVATE KEY ({err})", path.display()))?;
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der())
            .map_err(|err| format!("{}: not an ed25519 private key ({err})", path.display()))?;
        Ok(SigningKey { pair })
    }

    /// Signs `message`.
    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        let mut signature = [0u8; 64];
        signature.copy_from_slice(self.pair.sign(message).as_ref());
        signature
    }

    /// The public half.
    pub fn trusted(&self) -> TrustedKey {
        let mut public = [0u8; 32];
        public.copy_from_slice(self.pair.public_key().as_ref());
        TrustedKey { public }
    }
}

/// Names the key, never shows it.
impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey({})", self.trusted().id())
    }
}

impl TrustedKey {
    /// Reads a PEM `PUBLIC KEY` (an ed25519 SubjectPublicKeyInfo) from `path`.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let text = read_key_file(path)?;
        let der = SubjectPublicKeyInfoDer::from_pem_slice(&text)
            .map_err(|err| format!("{}: not a PEM PUBLIC KEY ({err})", path.display()))?;
        let public = der
            .strip_prefix(SPKI_PREFIX.as_slice())
            .and_then(|key| <[u8; 32]>::try_from(key).ok())
            .ok_or_else(|| format!("{}: not an ed25519 public key", path.display()))?;
        Ok(TrustedKey { public })
    }

    /// Whether `signature` is this key's over `message`.
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ED25519, self.public).verify(message, signature).is_ok()
    }

    /// A short name of the key: the first 16 hex digits of its SHA-256, as messages show it.
    pub fn id(&self) -> String {
        hex::encode(&Sha256::digest(self.public)[..8])
    }

    /// The PEM `PUBLIC KEY`.
    pub fn to_pem(&self) -> String {
        let mut der = SPKI_PREFIX.to_vec();
        der.extend_from_slice(&self.public);
        pem("PUBLIC KEY", &der)
    }
}

/// A new key pair: the PEM `PRIVATE KEY` (PKCS#8) and its public half.
pub fn generate() -> Result<(String, TrustedKey), String> {
    let random = ring::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&random).map_err(|err| format!("cannot make a key: {err}"))?;
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).map_err(|err| format!("cannot make a key: {err}"))?;
    let private = pem("PRIVATE KEY", pkcs8.as_ref());
    Ok((private, SigningKey { pair }.trusted()))
}

fn read_key_file(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).map_err(|err| format!("{}: {err}", path.display()))?;
    let mut text = Vec::new();
    file.take(KEY_FILE_MAX + 1).read_to_end(&mut text).map_err(|err| format!("{}: {err}", path.display()))?;
    if text.len() as u64 > KEY_FILE_MAX {
        return Err(format!("{}: larger than a key file ({} KiB at most)", path.display(), KEY_FILE_MAX >> 10));
    }
    Ok(text)
}

fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut text = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        text.push_str(std::str::from_utf8(line).unwrap_or_default());
        text.push('\n');
    }
    text.push_str(&format!("-----END {label}-----\n"));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_signs_and_its_public_half_verifies() {
        let dir = tempfile::tempdir().expect("a folder");
        let (private, public) = generate().expect("a key");
        std::fs::write(dir.path().join("k.key"), &private).expect("write");
        std::fs::write(dir.path().join("k.pub"), public.to_pem()).expect("write");
        let key = SigningKey::from_file(&dir.path().join("k.key")).expect("the private key reads back");
        let trusted = TrustedKey::from_file(&dir.path().join("k.pub")).expect("the public key reads back");
        let signature = key.sign(b"message");
        assert!(trusted.verifies(b"message", &signature));
        assert!(!trusted.verifies(b"messagE", &signature), "another message");
        let (_, other) = generate().expect("a key");
        assert!(!other.verifies(b"message", &signature), "another key");
        assert_ne!(trusted.id(), other.id());
    }

    #[test]
    fn a_file_that_is_no_key_is_refused_with_its_name() {
        let dir = tempfile::tempdir().expect("a folder");
        let path = dir.path().join("nonsense.pub");
        std::fs::write(&path, "hello").expect("write");
        let err = TrustedKey::from_file(&path).expect_err("refused");
        assert!(err.contains("nonsense.pub") && err.contains("PUBLIC KEY"), "{err}");
        let err = SigningKey::from_file(&path).expect_err("refused");
        assert!(err.contains("PRIVATE KEY"), "{err}");
        std::fs::write(&path, vec![b'a'; 20 << 10]).expect("write");
        let err = TrustedKey::from_file(&path).expect_err("refused");
        assert!(err.contains("larger than a key file"), "{err}");
    }
}
