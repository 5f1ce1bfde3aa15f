//! The API client every daemon builds the same way: from `--kubeconfig` when given, else
//! in-cluster configuration, else `$KUBECONFIG` / `~/.kube/config`.

use std::path::{Path, PathBuf};

/// The `--kubeconfig` flag; flatten into a subcommand's arguments.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct KubeArgs {
    /// Kubeconfig file (in-cluster configuration, else $KUBECONFIG, when absent).
    #[arg(long, value_name = "FILE", env = "FGPU_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("--kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("no --kubeconfig, and neither in-cluster config nor $KUBECONFIG works: {0}")]
    Infer(#[source] kube::config::InferConfigError),
    #[error("building the API client: {0}")]
    Build(#[source] kube::Error),
}

impl KubeArgs {
    /// The client these flags name.
    pub async fn client(&self) -> Result<kube::Client, ClientError> {
        client(self.kubeconfig.as_deref()).await
    }
}

/// The API client: from `kubeconfig` when given, else inferred.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, ClientError> {
    crate::tls_provider();
    let config = match kubeconfig {
        Some(path) => {
            let err = |source| ClientError::Kubeconfig {
                path: path.to_owned(),
                source,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(err)?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(err)?
        }
        None => kube::Config::infer().await.map_err(ClientError::Infer)?,
    };
    kube::Client::try_from(config).map_err(ClientError::Build)
}
