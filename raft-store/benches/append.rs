//! The cost of making one entry durable: `LogStore::append` of one ~300-byte entry until its
//! `IOFlushed` callback fires (writer thread hand-off, frame, write, `fdatasync`), against a
//! bare `write` + `fdatasync` of the same size on the same disk. The ratio is what the log
//! adds on the critical path of every command, on the leader and on each follower.
//! `TALLY_BENCH_DIR` picks the disk (default: the system temp dir).

use std::io::Write;
use std::time::Duration;

use criterion::Criterion;
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::type_config::TypeConfigExt;
use tally_raft_store::LogStore;

openraft::declare_raft_types!(BenchConfig: D = String, R = u64,);
type C = BenchConfig;
type Entry = <C as openraft::RaftTypeConfig>::Entry;

const PAYLOAD_BYTES: usize = 300;

fn entry(index: u64) -> Entry {
    let log_id = openraft::LogId {
        leader_id: openraft::impls::leader_id_adv::LeaderId {
            term: 1,
            node_id: 0,
        },
        index,
    };
    Entry::new_normal(log_id, "x".repeat(PAYLOAD_BYTES))
}

fn bench_dir() -> tempfile::TempDir {
    match std::env::var_os("TALLY_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .expect("a temp dir")
}

fn durable_append(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime");
    let dir = bench_dir();
    let mut store = LogStore::<C>::open(dir.path().join("raft-log")).expect("open");
    let mut index = 0;
    let mut group = c.benchmark_group("durable append, one entry");
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("LogStore::append until IOFlushed", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let (tx, rx) = C::oneshot();
                store
                    .append(vec![entry(index)], IOFlushed::signal(tx))
                    .await
                    .expect("append");
                rx.await.expect("callback").expect("durable");
            });
            index += 1;
        })
    });
    let mut file = std::fs::File::create(dir.path().join("bare")).expect("file");
    let bytes = vec![7u8; PAYLOAD_BYTES + 40];
    group.bench_function("bare write + fdatasync", |b| {
        b.iter(|| {
            file.write_all(&bytes).expect("write");
            file.sync_data().expect("fdatasync");
        })
    });
    group.finish();
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    durable_append(&mut criterion);
    criterion.final_summary();
}
