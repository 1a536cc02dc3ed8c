//! `tally-node certs`: a cluster CA and the certificates it issues, for production. The
//! files land in `--dir` as `ca.pem`/`ca.key`, `<name>.pem`/`<name>.key` (keys mode 0600);
//! nothing is ever overwritten. Rotation without downtime: issue new certificates from the
//! same CA, replace the files, and restart nodes one at a time (a rolling restart keeps a
//! quorum); to change the CA itself, see docs/operations.md, "Security".

use std::path::PathBuf;

use clap::{Args, Subcommand};
use tally_tls::{CertAuthority, Namespace, Role};

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Where the CA lives and the certificates are written.
    #[arg(long, default_value = "./tally-certs")]
    pub dir: PathBuf,
    /// Validity of what is issued, in days (1 to 3650).
    #[arg(long, default_value_t = 365)]
    pub days: u32,
    #[command(subcommand)]
    pub command: CertsCommand,
}

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Create the cluster's CA (`ca.pem`, `ca.key`). Keep `ca.key` offline once the
    /// certificates are issued.
    Ca {
        /// Named in the CA's subject.
        #[arg(long, default_value = "tally")]
        cluster: String,
    },
    /// A node certificate (`node-<id>.pem`): serves both ports and calls peers. It names the
    /// node id (peers check it on every Raft call), `tally-node`, `localhost`, 127.0.0.1 and
    /// every --host.
    Node {
        #[arg(long)]
        id: u64,
        /// Another DNS name or IP address the node is reached at (repeatable).
        #[arg(long = "host")]
        hosts: Vec<String>,
    },
    /// A client certificate (`<name>.pem`) with a role: `kernel` (budget commands and reads
    /// within its namespaces; also what a kernel node presents to a payment rail), `reader`
    /// (reads), `operator` (Admin), `agent` (calls a kernel node's `tally.kernel.v1.Kernel`).
    Client {
        #[arg(long)]
        name: String,
        #[arg(long, value_parser = parse_role)]
        role: Role,
        /// For kernels: a root issuer's ed25519 public key in hex whose families it may
        /// touch, or `*` for all (repeatable, at least one for a kernel).
        #[arg(long = "namespace", value_parser = parse_namespace)]
        namespaces: Vec<Namespace>,
    },
    /// A server certificate for a kernel node's port (`--kind kernel`: DNS name
    /// `tally-kernel`) or a payment rail's (`--kind rail`: `tally-rail`), plus `localhost`,
    /// 127.0.0.1 and every --host. It carries no role: it serves, it calls nothing.
    Server {
        /// Written as `<name>.pem`/`.key` (`kernel-server` and `rail` are the names
        /// `tally-kernel` looks for by default).
        #[arg(long)]
        name: String,
        #[arg(long, value_enum)]
        kind: ServerKind,
        /// Another DNS name or IP address the server is reached at (repeatable).
        #[arg(long = "host")]
        hosts: Vec<String>,
    },
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ServerKind {
    Kernel,
    Rail,
}

impl ServerKind {
    fn server_name(self) -> &'static str {
        match self {
            Self::Kernel => tally_tls::issue::KERNEL_SERVER_NAME,
            Self::Rail => tally_tls::issue::RAIL_SERVER_NAME,
        }
    }
}

fn parse_role(value: &str) -> Result<Role, String> {
    Role::parse(value).ok_or_else(|| format!("{value:?} is not kernel, reader, operator or agent"))
}

fn parse_namespace(value: &str) -> Result<Namespace, String> {
    Namespace::parse(value).map_err(|e| e.to_string())
}

pub fn run(args: CertsArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir)?;
    match args.command {
        CertsCommand::Ca { cluster } => {
            CertAuthority::generate(&cluster, args.days)?.write(&args.dir)?;
            println!("CA written to {}/ca.pem and ca.key", args.dir.display());
        }
        CertsCommand::Node { id, hosts } => {
            let name = format!("node-{id}");
            CertAuthority::load(&args.dir)?
                .issue_node(id, &hosts, args.days)?
                .write(&args.dir, &name)?;
            println!(
                "node {id}: {0}/{name}.pem and {name}.key",
                args.dir.display()
            );
        }
        CertsCommand::Client {
            name,
            role,
            namespaces,
        } => {
            CertAuthority::load(&args.dir)?
                .issue_client(&name, role, namespaces, args.days)?
                .write(&args.dir, &name)?;
            println!(
                "{role} {name}: {0}/{name}.pem and {name}.key",
                args.dir.display()
            );
        }
        CertsCommand::Server { name, kind, hosts } => {
            let server_name = kind.server_name();
            CertAuthority::load(&args.dir)?
                .issue_server(&name, server_name, &hosts, args.days)?
                .write(&args.dir, &name)?;
            println!(
                "{server_name} server {name}: {0}/{name}.pem and {name}.key",
                args.dir.display()
            );
        }
    }
    Ok(())
}
