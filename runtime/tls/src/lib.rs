//! The process's one rustls crypto provider: ring. kube's client, the link and OpenDAL's HTTP
//! transport (reqwest, built without a provider of its own) all take the process default; with
//! none installed, or with two linked, rustls panics on its first handshake. Every entry point
//! that may make a TLS connection calls [`install_crypto_provider`] first.

use std::sync::Once;

/// Installs ring as the process's rustls crypto provider; a no-op after the first call.
pub fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // Only another call racing this one (impossible under `Once`) or a host application that
        // installed ring itself can have set one; either way the process has a provider.
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn ring_is_the_process_default() {
        super::install_crypto_provider();
        super::install_crypto_provider();
        let provider = tokio_rustls::rustls::crypto::CryptoProvider::get_default().expect("a provider");
        let ring = tokio_rustls::rustls::crypto::ring::default_provider();
        let names = |p: &tokio_rustls::rustls::crypto::CryptoProvider| {
            p.cipher_suites.iter().map(|s| format!("{:?}", s.suite())).collect::<Vec<_>>()
        };
        assert_eq!(names(provider), names(&ring));
    }
}
