//! The deployment files under deploy/ keep the promises Tally relies on (deploy/README.md):
//! every `TALLY_*` variable handed to `tally-node serve` is a field of its configuration (an
//! unknown one makes the node refuse to start), a new cluster can form on Kubernetes (a
//! headless Service that publishes not-ready addresses, pods started in parallel, node ids from
//! the pod index), readiness means "serving" and liveness does not need a leader, keys reach
//! tally private to its user, disruptions keep a quorum, the kernels scale, compose uses only
//! its own network, and the systemd units are hardened and stop each binary the way it stops.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize as _;
use serde_yaml::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_owned()
}

fn read(relative: &str) -> String {
    let path = repo().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every YAML document of a file (`---` separated), empty ones skipped.
fn documents(relative: &str) -> Vec<Value> {
    let text = read(relative);
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            let mut value = Value::deserialize(doc).unwrap_or_else(|e| panic!("{relative}: {e}"));
            // `<<: *anchor` merge keys, as compose and Kubernetes read them.
            value
                .apply_merge()
                .unwrap_or_else(|e| panic!("{relative}: {e}"));
            value
        })
        .filter(|doc: &Value| !doc.is_null())
        .collect()
}

/// `value` at a path of keys and indexes (`"spec.template.spec.containers.0"`).
fn at<'a>(value: &'a Value, path: &str) -> &'a Value {
    let mut current = value;
    for key in path.split('.') {
        current = match key.parse::<usize>() {
            Ok(index) => current.get(index),
            Err(_) => current.get(key),
        }
        .unwrap_or_else(|| panic!("no {path:?} (stopped at {key:?}) in {value:?}"));
    }
    current
}

fn text<'a>(value: &'a Value, path: &str) -> &'a str {
    at(value, path)
        .as_str()
        .unwrap_or_else(|| panic!("{path} is not a string"))
}

fn list<'a>(value: &'a Value, path: &str) -> &'a Vec<Value> {
    at(value, path)
        .as_sequence()
        .unwrap_or_else(|| panic!("{path} is not a list"))
}

fn strings(values: &[Value]) -> Vec<String> {
    values
        .iter()
        .map(|v| match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            other => panic!("{other:?} is not a string"),
        })
        .collect()
}

/// The `pub` fields of `struct NAME` in a Rust source file: the configuration's keys, read
/// from the code so a renamed field fails here rather than at a node's start.
fn struct_fields(relative: &str, name: &str) -> BTreeSet<String> {
    let source = read(relative);
    let start = source
        .find(&format!("pub struct {name} {{"))
        .unwrap_or_else(|| panic!("no struct {name} in {relative}"));
    let body = &source[start..];
    let body = &body[..body.find("\n}").expect("end of struct")];
    let fields: BTreeSet<String> = body
        .lines()
        .filter_map(|line| line.trim().strip_prefix("pub "))
        .filter_map(|rest| rest.split_once(':'))
        .map(|(field, _)| field.trim().to_owned())
        .filter(|field| !field.contains(' '))
        .collect();
    assert!(fields.len() >= 3, "{name}: found only {fields:?}");
    fields
}

/// Checks that `TALLY_*` variables given to `tally-node serve` name `NodeConfig` fields
/// (`TALLY_TLS__CERT_FILE` is `[tls] cert_file`): figment maps every `TALLY_*` variable to a
/// key, and the node refuses unknown keys. Returns the variables as a map.
fn check_node_env(where_: &str, env: &BTreeMap<String, String>) {
    let node = struct_fields("authority/src/node/config.rs", "NodeConfig");
    let tls = struct_fields("tls/src/files.rs", "TlsFiles");
    for name in env.keys().filter(|n| n.starts_with("TALLY_")) {
        let key = name["TALLY_".len()..].to_ascii_lowercase();
        let known = match key.split_once("__") {
            Some(("tls", field)) => tls.contains(field),
            Some(_) => false,
            None => node.contains(&key),
        };
        assert!(
            known,
            "{where_}: {name} is not a tally-node setting, so `serve` would refuse to start \
             (fields: {node:?}, tls: {tls:?})"
        );
    }
    for required in [
        "TALLY_NODE_ID",
        "TALLY_LISTEN_ADDR",
        "TALLY_PEER_LISTEN_ADDR",
        "TALLY_ADVERTISE_ADDR",
        "TALLY_PEER_ADVERTISE_ADDR",
        "TALLY_REGION",
        "TALLY_DATA_DIR",
        "TALLY_TLS__CA_FILE",
        "TALLY_TLS__CERT_FILE",
        "TALLY_TLS__KEY_FILE",
    ] {
        assert!(
            env.contains_key(required),
            "{where_}: {required} is not set"
        );
    }
    let listen = &env["TALLY_LISTEN_ADDR"];
    let peer = &env["TALLY_PEER_LISTEN_ADDR"];
    assert_ne!(
        port(listen),
        port(peer),
        "{where_}: the peer port must differ from the client port"
    );
    assert!(
        listen.starts_with("0.0.0.0:"),
        "{where_}: {listen} is unreachable from other containers"
    );
}

fn port(address: &str) -> u16 {
    address
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("{address} has no port"))
}

/// A container's `env` list as a map; values from `valueFrom` become their field path.
fn container_env(container: &Value) -> BTreeMap<String, String> {
    container
        .get("env")
        .and_then(Value::as_sequence)
        .map(|env| {
            env.iter()
                .map(|var| {
                    let value = match var.get("value") {
                        Some(v) => v.as_str().expect("env value is a string").to_owned(),
                        None => format!("valueFrom:{}", text(var, "valueFrom.fieldRef.fieldPath")),
                    };
                    (text(var, "name").to_owned(), value)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn by_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| text(d, "kind") == kind).collect()
}

fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    by_kind(docs, kind)
        .into_iter()
        .find(|d| text(d, "metadata.name") == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn labels_match(selector: &Value, labels: &Value) -> bool {
    selector
        .as_mapping()
        .expect("selector is a map")
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
}

/// The probe's exec command, if it is one.
fn exec(probe: &Value) -> Option<Vec<String>> {
    probe.get("exec").map(|e| strings(list(e, "command")))
}

/// `tally-node healthcheck` over TLS with a certificate that the pod really has: its
/// `--tls-dir` is a mounted volume and `--identity`'s files are written there.
fn assert_tls_healthcheck(where_: &str, command: &[String], mounts: &BTreeSet<String>) {
    assert_eq!(
        &command[..2],
        ["tally-node", "healthcheck"],
        "{where_}: {command:?}"
    );
    assert!(
        !command.contains(&"--insecure".to_owned()),
        "{where_}: TLS, not --insecure"
    );
    let arg = |flag: &str| {
        command
            .iter()
            .position(|c| c == flag)
            .and_then(|i| command.get(i + 1))
            .unwrap_or_else(|| panic!("{where_}: {flag} missing in {command:?}"))
            .clone()
    };
    let dir = arg("--tls-dir");
    assert!(
        mounts.contains(&dir),
        "{where_}: --tls-dir {dir} is not mounted ({mounts:?})"
    );
    arg("--identity");
    assert!(
        arg("--endpoint").starts_with("127.0.0.1:"),
        "{where_}: checks its own node"
    );
}

fn mount_paths(container: &Value) -> BTreeSet<String> {
    container
        .get("volumeMounts")
        .and_then(Value::as_sequence)
        .map(|m| m.iter().map(|m| text(m, "mountPath").to_owned()).collect())
        .unwrap_or_default()
}

/// Key material comes from a Secret mounted 0400 (never group- or world-readable), and is
/// copied by an init container, with umask 077, into an in-memory volume that the main
/// container reads: with `fsGroup` the kubelet adds group read to Secret files, which tally
/// refuses for a key.
fn assert_keys_private(where_: &str, pod: &Value, key_files: &[&str]) {
    assert_eq!(
        at(pod, "securityContext.runAsNonRoot"),
        &Value::Bool(true),
        "{where_}"
    );
    let user = at(pod, "securityContext.runAsUser")
        .as_u64()
        .expect("runAsUser");
    assert_ne!(user, 0, "{where_}: runs as root");
    assert_eq!(
        at(pod, "securityContext.fsGroup").as_u64(),
        Some(10001),
        "{where_}: fsGroup is the image's tally group, so volumes are writable"
    );
    let volumes = list(pod, "volumes");
    let secret = volumes
        .iter()
        .find(|v| v.get("secret").is_some())
        .unwrap_or_else(|| panic!("{where_}: certificates come from a Secret"));
    let mode = file_mode(at(secret, "secret.defaultMode"));
    assert_eq!(
        mode & 0o077,
        0,
        "{where_}: Secret defaultMode {mode:o} lets others read keys"
    );
    let secret_volume = text(secret, "name");
    let memory = volumes
        .iter()
        .find(|v| {
            v.get("emptyDir")
                .and_then(|e| e.get("medium"))
                .and_then(Value::as_str)
                == Some("Memory")
        })
        .unwrap_or_else(|| panic!("{where_}: no in-memory volume for the copied keys"));
    let memory_volume = text(memory, "name");
    let init = list(pod, "initContainers")
        .iter()
        .find(|c| {
            list(c, "volumeMounts")
                .iter()
                .any(|m| text(m, "name") == secret_volume)
        })
        .unwrap_or_else(|| panic!("{where_}: no init container reads the Secret"));
    let script = strings(list(init, "command")).join(" ");
    assert!(
        script.contains("umask 077"),
        "{where_}: copies keys without umask 077: {script}"
    );
    let memory_path = list(init, "volumeMounts")
        .iter()
        .find(|m| text(m, "name") == memory_volume)
        .map(|m| text(m, "mountPath").to_owned())
        .unwrap_or_else(|| panic!("{where_}: the init container does not mount {memory_volume}"));
    for key in key_files {
        assert!(
            script.contains(&format!("> {memory_path}/{key}")),
            "{where_}: {key} is not copied into {memory_path}: {script}"
        );
    }
    for container in list(pod, "containers") {
        assert!(
            !list(container, "volumeMounts")
                .iter()
                .any(|m| text(m, "name") == secret_volume),
            "{where_}: the main container must read the private copies, not the Secret"
        );
    }
}

/// A file mode as Kubernetes reads it: YAML 1.1, where `0400` is octal (serde_yaml, YAML 1.2,
/// leaves it a string) and `256` decimal.
fn file_mode(value: &Value) -> u64 {
    match value {
        Value::Number(n) => n.as_u64().expect("a mode is a positive integer"),
        Value::String(s) if s.starts_with('0') => {
            u64::from_str_radix(s, 8).unwrap_or_else(|_| panic!("{s:?} is not an octal mode"))
        }
        other => panic!("{other:?} is not a file mode"),
    }
}

fn assert_hardened_container(where_: &str, container: &Value) {
    assert_eq!(
        at(container, "securityContext.allowPrivilegeEscalation"),
        &Value::Bool(false),
        "{where_}"
    );
    assert_eq!(
        at(container, "securityContext.readOnlyRootFilesystem"),
        &Value::Bool(true),
        "{where_}"
    );
    assert_eq!(
        strings(list(container, "securityContext.capabilities.drop")),
        ["ALL"],
        "{where_}"
    );
}

#[test]
fn the_statefulset_can_form_a_cluster_and_probes_mean_what_tally_means() {
    let docs = documents("deploy/k8s/tally-node.yaml");
    let set = by_kind(&docs, "StatefulSet");
    assert_eq!(set.len(), 1);
    let set = set[0];
    let pod = at(set, "spec.template.spec");
    let pod_labels = at(set, "spec.template.metadata.labels");
    assert!(labels_match(
        at(set, "spec.selector.matchLabels"),
        pod_labels
    ));

    // Peer discovery before anything is ready.
    let headless = named(&docs, "Service", text(set, "spec.serviceName"));
    assert_eq!(
        text(headless, "spec.clusterIP"),
        "None",
        "the StatefulSet's Service is headless"
    );
    assert_eq!(
        at(headless, "spec.publishNotReadyAddresses"),
        &Value::Bool(true),
        "peers must resolve before a quorum exists"
    );
    assert!(labels_match(at(headless, "spec.selector"), pod_labels));
    assert_eq!(
        text(set, "spec.podManagementPolicy"),
        "Parallel",
        "OrderedReady waits for tally-1 to be ready, which it cannot be alone"
    );
    let replicas = at(set, "spec.replicas").as_u64().expect("replicas");
    assert!(
        replicas % 2 == 1 && (3..=7).contains(&replicas),
        "an odd number of voters, 3 to 7"
    );

    // Node ids: 1.. from the pod index.
    assert_eq!(
        at(set, "spec.ordinals.start").as_u64(),
        Some(1),
        "node ids start at 1"
    );
    let containers = list(pod, "containers");
    assert_eq!(containers.len(), 1);
    let node = &containers[0];
    assert_eq!(strings(list(node, "command")), ["tally-node", "serve"]);
    let env = container_env(node);
    check_node_env("tally-node.yaml", &env);
    assert_eq!(
        env["TALLY_NODE_ID"],
        "valueFrom:metadata.labels['apps.kubernetes.io/pod-index']"
    );
    let service = text(headless, "metadata.name");
    for (var, listen) in [
        ("TALLY_ADVERTISE_ADDR", "TALLY_LISTEN_ADDR"),
        ("TALLY_PEER_ADVERTISE_ADDR", "TALLY_PEER_LISTEN_ADDR"),
    ] {
        assert!(
            env[var].starts_with(&format!("$(POD_NAME).{service}.")),
            "{var}: {}",
            env[var]
        );
        assert_eq!(port(&env[var]), port(&env[listen]), "{var} and {listen}");
        assert!(
            env.contains_key("POD_NAME") && env.contains_key("POD_NAMESPACE"),
            "$(POD_NAME) and $(POD_NAMESPACE) are defined before use"
        );
    }
    let ports: BTreeSet<u16> = list(headless, "spec.ports")
        .iter()
        .map(|p| at(p, "port").as_u64().unwrap() as u16)
        .collect();
    assert!(
        ports.contains(&port(&env["TALLY_LISTEN_ADDR"]))
            && ports.contains(&port(&env["TALLY_PEER_LISTEN_ADDR"]))
    );

    // Data on its own volume claim, mounted at data_dir.
    let claims = list(set, "spec.volumeClaimTemplates");
    let data_mount = list(node, "volumeMounts")
        .iter()
        .find(|m| text(m, "mountPath") == env["TALLY_DATA_DIR"])
        .expect("data_dir is a mounted volume");
    assert!(
        claims
            .iter()
            .any(|c| text(c, "metadata.name") == text(data_mount, "name")),
        "data_dir is on a PersistentVolumeClaim"
    );

    // Keys private, TLS files where the config points.
    assert_keys_private("tally-node.yaml", pod, &["ca.pem", "node.pem", "node.key"]);
    let mounts = mount_paths(node);
    for var in [
        "TALLY_TLS__CA_FILE",
        "TALLY_TLS__CERT_FILE",
        "TALLY_TLS__KEY_FILE",
    ] {
        let dir = Path::new(&env[var])
            .parent()
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            mounts.contains(&dir),
            "{var}={} is not on a mounted volume",
            env[var]
        );
    }
    assert_hardened_container("tally-node", node);

    // Ready = serving, over TLS; alive without a leader.
    let readiness =
        exec(at(node, "readinessProbe")).expect("readiness runs tally-node healthcheck");
    assert_tls_healthcheck("readinessProbe", &readiness, &mounts);
    assert_eq!(
        Path::new(&env["TALLY_TLS__CERT_FILE"])
            .file_stem()
            .unwrap()
            .to_str()
            .unwrap(),
        readiness[readiness.iter().position(|c| c == "--identity").unwrap() + 1],
        "the probe presents the node's own certificate"
    );
    for probe in ["livenessProbe", "startupProbe"] {
        let probe_value = at(node, probe);
        assert!(
            !exec(probe_value).is_some_and(|c| c.contains(&"healthcheck".to_owned())),
            "{probe}: `tally-node healthcheck` fails without a leader; restarting nodes for a \
             lost quorum makes it worse"
        );
        let probe_port = at(probe_value, "httpGet.port");
        let metrics_port = list(node, "ports")
            .iter()
            .find(|p| {
                Some(at(p, "name")) == Some(probe_port) || at(p, "containerPort") == probe_port
            })
            .map(|p| at(p, "containerPort").as_u64().unwrap() as u16)
            .unwrap_or_else(|| panic!("{probe} port {probe_port:?} is not a container port"));
        assert_eq!(
            metrics_port,
            port(&env["TALLY_METRICS_ADDR"]),
            "{probe} asks the metrics listener"
        );
        assert_eq!(text(probe_value, "httpGet.path"), "/metrics");
    }

    // Disruptions keep a quorum.
    let budget = by_kind(&docs, "PodDisruptionBudget");
    assert_eq!(budget.len(), 1);
    assert!(labels_match(
        at(budget[0], "spec.selector.matchLabels"),
        pod_labels
    ));
    let unavailable = at(budget[0], "spec.maxUnavailable")
        .as_u64()
        .expect("maxUnavailable");
    assert!(
        unavailable >= 1 && unavailable <= (replicas - 1) / 2,
        "maxUnavailable {unavailable} of {replicas} voters"
    );

    // The bootstrap Job names every member with the advertised addresses.
    let job = named(&docs, "Job", "tally-init");
    let job_pod = at(job, "spec.template.spec");
    let init = strings(list(&list(job_pod, "containers")[0], "command"));
    assert_eq!(&init[..2], ["tally-node", "init"]);
    let members: Vec<&String> = init
        .iter()
        .skip_while(|c| *c != "--member")
        .skip(1)
        .step_by(2)
        .collect();
    assert_eq!(
        members.len() as u64,
        replicas,
        "--member for every replica: {init:?}"
    );
    for (i, member) in members.iter().enumerate() {
        let id = i + 1;
        let (member_id, rest) = member.split_once('=').expect("ID=CLIENT,PEER,REGION");
        assert_eq!(member_id, id.to_string());
        let parts: Vec<&str> = rest.split(',').collect();
        assert_eq!(parts.len(), 3, "{member}");
        let pod_name = format!("{}-{id}", text(set, "metadata.name"));
        let expand = |template: &str| template.replace("$(POD_NAME)", &pod_name);
        assert_eq!(
            parts[0],
            expand(&env["TALLY_ADVERTISE_ADDR"]),
            "member {id}'s client address"
        );
        assert_eq!(
            parts[1],
            expand(&env["TALLY_PEER_ADVERTISE_ADDR"]),
            "member {id}'s peer address"
        );
        assert_eq!(parts[2], env["TALLY_REGION"], "member {id}'s region");
    }
    assert_keys_private(
        "tally-init Job",
        job_pod,
        &["ca.pem", "operator.pem", "operator.key"],
    );
}

#[test]
fn kernels_scale_on_their_own_and_read_private_keys() {
    let docs = documents("deploy/k8s/tally-kernel.yaml");
    let deployment = named(&docs, "Deployment", "tally-kernel");
    let pod = at(deployment, "spec.template.spec");
    let pod_labels = at(deployment, "spec.template.metadata.labels");
    assert!(labels_match(
        at(deployment, "spec.selector.matchLabels"),
        pod_labels
    ));
    assert_keys_private(
        "tally-kernel.yaml",
        pod,
        &[
            "ca.pem",
            "kernel.pem",
            "kernel.key",
            "kernel-server.pem",
            "kernel-server.key",
            "kernel.seed",
        ],
    );

    let hpa = by_kind(&docs, "HorizontalPodAutoscaler");
    assert_eq!(hpa.len(), 1);
    assert_eq!(text(hpa[0], "apiVersion"), "autoscaling/v2");
    assert_eq!(text(hpa[0], "spec.scaleTargetRef.kind"), "Deployment");
    assert_eq!(text(hpa[0], "spec.scaleTargetRef.name"), "tally-kernel");
    let min = at(hpa[0], "spec.minReplicas")
        .as_u64()
        .expect("minReplicas");
    assert!(min >= 2, "one kernel is a single point of failure");
    assert!(at(hpa[0], "spec.maxReplicas").as_u64().unwrap() > min);
    let budget = by_kind(&docs, "PodDisruptionBudget");
    assert!(budget
        .iter()
        .any(|b| labels_match(at(b, "spec.selector.matchLabels"), pod_labels)));

    let kernel = &list(pod, "containers")[0];
    assert_hardened_container("tally-kernel", kernel);
    let command = strings(list(kernel, "command")).join(" ");
    assert!(command.contains("tally-kernel serve --config"), "{command}");
    // Kubernetes' SIGTERM must reach the kernel itself (it stops gracefully on it;
    // kernel-node/tests/serve_process.rs): no shell in between.
    assert!(
        command.starts_with("tally-kernel serve --config"),
        "the kernel is the container's process: {command}"
    );
    // Readiness: the kernel's grpc.health.v1 over mutual TLS (`tally-kernel healthcheck`
    // verifies the name kernel certificates carry).
    let readiness = exec(at(kernel, "readinessProbe")).expect("readiness is exec");
    assert_eq!(
        &readiness[..2],
        ["tally-kernel", "healthcheck"],
        "{readiness:?}"
    );
    let flag = |name: &str| {
        readiness
            .iter()
            .position(|c| c == name)
            .map(|i| readiness[i + 1].clone())
            .unwrap_or_else(|| panic!("readiness: no {name}"))
    };
    assert!(!readiness.contains(&"--insecure".to_owned()));
    assert!(mount_paths(kernel).contains(&flag("--tls-dir")));
    assert!(at(kernel, "livenessProbe").get("httpGet").is_some());
    assert!(
        at(kernel, "resources.requests.cpu").as_str().is_some(),
        "the HPA scales on CPU requests"
    );

    // The configuration names only KernelNodeConfig fields, and the key and TLS files the
    // init container writes.
    let config_map = named(&docs, "ConfigMap", "tally-kernel");
    let toml_text = at(config_map, "data")
        .get("kernel.toml")
        .and_then(Value::as_str)
        .expect("data: kernel.toml");
    let fields = struct_fields("kernel-node/src/config.rs", "KernelNodeConfig");
    let mut keys = BTreeSet::new();
    for line in toml_text.lines().map(str::trim) {
        if line.starts_with('[') || line.starts_with('#') || line.is_empty() {
            if line.starts_with('[') {
                keys.insert(line.trim_matches(['[', ']']).to_owned());
            }
            continue;
        }
        if let Some((key, value)) = line.split_once('=') {
            let key = key.trim();
            if keys
                .iter()
                .any(|section| section == "rail" || section == "tool_servers")
            {
                continue;
            }
            assert!(
                fields.contains(key),
                "kernel.toml: {key} is not a KernelNodeConfig field"
            );
            assert!(
                key != "insecure" && key != "cluster_insecure",
                "kernel.toml: {line}: production kernels speak TLS"
            );
            if key == "key_file" || key == "cluster_tls_dir" || key == "tls_dir" {
                let path = value.trim().trim_matches('"');
                let dir = if key == "key_file" {
                    Path::new(path).parent().unwrap().to_str().unwrap()
                } else {
                    path
                };
                assert!(
                    mount_paths(kernel).contains(dir),
                    "{key} = {path} is not mounted"
                );
            }
        }
    }
    for env in container_env(kernel).keys() {
        if let Some(field) = env.strip_prefix("TALLY_KERNEL_") {
            assert!(
                fields.contains(&field.to_ascii_lowercase()),
                "{env} is not a kernel setting"
            );
        }
    }
}

#[test]
fn every_kubernetes_object_has_a_kind_a_name_and_one_image() {
    let mut images = BTreeSet::new();
    for file in ["deploy/k8s/tally-node.yaml", "deploy/k8s/tally-kernel.yaml"] {
        let docs = documents(file);
        assert!(!docs.is_empty());
        for doc in &docs {
            assert!(
                !text(doc, "apiVersion").is_empty() && !text(doc, "kind").is_empty(),
                "{file}"
            );
            assert!(!text(doc, "metadata.name").is_empty(), "{file}");
            if let Some(pod) = doc
                .get("spec")
                .and_then(|s| s.get("template"))
                .and_then(|t| t.get("spec"))
            {
                for key in ["containers", "initContainers"] {
                    for container in pod
                        .get(key)
                        .and_then(Value::as_sequence)
                        .into_iter()
                        .flatten()
                    {
                        images.insert(text(container, "image").to_owned());
                    }
                }
            }
        }
    }
    assert_eq!(images.len(), 1, "one image holds every binary: {images:?}");
}

#[test]
fn compose_nodes_start_with_valid_settings_on_their_own_network() {
    let compose = documents("deploy/compose/docker-compose.yml");
    assert_eq!(compose.len(), 1);
    let services = at(&compose[0], "services").as_mapping().expect("services");
    let setup_script = read("deploy/compose/setup.sh");
    let mut node_ids = BTreeSet::new();
    for (name, service) in services {
        let name = name.as_str().expect("service name");
        assert!(
            service.get("network_mode").is_none(),
            "{name}: only the project's own network"
        );
        assert!(
            service.get("container_name").is_none(),
            "{name}: a fixed container name clashes between projects"
        );
        let command = service
            .get("command")
            .map(|c| strings(c.as_sequence().expect("command list")))
            .unwrap_or_default();
        let env: BTreeMap<String, String> = service
            .get("environment")
            .and_then(Value::as_mapping)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| {
                        (
                            k.as_str().unwrap().to_owned(),
                            strings(std::slice::from_ref(v)).remove(0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        if command.first().map(String::as_str) == Some("tally-node")
            && command.get(1).map(String::as_str) == Some("serve")
        {
            check_node_env(name, &env);
            let id = &env["TALLY_NODE_ID"];
            assert!(node_ids.insert(id.clone()), "node id {id} twice");
            assert_eq!(
                env["TALLY_TLS__CERT_FILE"],
                format!("/etc/tally/tls/node-{id}.pem")
            );
            assert!(
                setup_script.contains("node --id \"$i\"")
                    && setup_script.contains("copy \"node-$i.key\""),
                "setup.sh issues node-N certificates into the shared volume"
            );
            let test = strings(list(service, "healthcheck.test"));
            assert_eq!(test[0], "CMD");
            let mounts: BTreeSet<String> = list(service, "volumes")
                .iter()
                .map(|v| v.as_str().unwrap().split(':').nth(1).unwrap().to_owned())
                .collect();
            assert_tls_healthcheck(name, &test[1..], &mounts);
            assert!(
                test.contains(&format!("node-{id}")),
                "{name}: the probe presents the node's certificate"
            );
            assert!(
                mounts.contains(&env["TALLY_DATA_DIR"]),
                "{name}: data_dir is a volume"
            );
        }
        if command.first().map(String::as_str) == Some("tally-kernel") {
            assert!(
                service.get("stop_signal").is_none(),
                "{name}: Docker's SIGTERM stops tally-kernel gracefully"
            );
            let config = command.last().unwrap();
            let file = Path::new(config).file_name().unwrap().to_str().unwrap();
            let pattern = file.replace(|c: char| c.is_ascii_digit(), "$i");
            assert!(
                setup_script.contains(&pattern),
                "{name}: setup.sh does not write {config} ({pattern})"
            );
        }
        for value in env.keys() {
            assert!(
                !value.starts_with("TALLY_KERNEL_")
                    || command.first().map(String::as_str) == Some("tally-kernel")
            );
        }
    }
    assert_eq!(node_ids.len(), 3, "three voters");
    for script in ["deploy/compose/setup.sh", "deploy/compose/init-cluster.sh"] {
        assert!(
            read(script).starts_with("#!/bin/sh\n"),
            "{script} runs in the image's /bin/sh (dash)"
        );
    }
}

/// `Key=value` lines of a systemd unit, keyed by `Section.Key` (repeated keys kept in order).
fn unit(relative: &str) -> BTreeMap<String, Vec<String>> {
    let mut section = String::new();
    let mut entries: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in read(relative).lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{relative}: {line}"));
        entries
            .entry(format!("{section}.{key}"))
            .or_default()
            .push(value.to_owned());
    }
    entries
}

#[test]
fn systemd_units_are_hardened_and_stop_each_binary_its_way() {
    for (file, binary, stop_signal) in [
        ("deploy/systemd/tally-node.service", "tally-node", "SIGTERM"),
        (
            "deploy/systemd/tally-kernel.service",
            "tally-kernel",
            "SIGTERM",
        ),
    ] {
        let unit = unit(file);
        let one = |key: &str| {
            let values = unit.get(key).unwrap_or_else(|| panic!("{file}: no {key}"));
            values.last().unwrap().clone()
        };
        for (key, value) in [
            ("Service.NoNewPrivileges", "yes"),
            ("Service.ProtectSystem", "strict"),
            ("Service.ProtectHome", "yes"),
            ("Service.PrivateTmp", "yes"),
            ("Service.PrivateDevices", "yes"),
            ("Service.ProtectKernelTunables", "yes"),
            ("Service.ProtectKernelModules", "yes"),
            ("Service.ProtectControlGroups", "yes"),
            ("Service.RestrictSUIDSGID", "yes"),
            ("Service.MemoryDenyWriteExecute", "yes"),
            ("Service.LockPersonality", "yes"),
            ("Service.SystemCallArchitectures", "native"),
            ("Service.CapabilityBoundingSet", ""),
            ("Service.UMask", "0077"),
            ("Service.Restart", "on-failure"),
        ] {
            assert_eq!(one(key), value, "{file}: {key}");
        }
        assert_ne!(one("Service.User"), "root", "{file}");
        assert!(one("Service.RestrictAddressFamilies")
            .split(' ')
            .all(|f| ["AF_INET", "AF_INET6", "AF_UNIX"].contains(&f)));
        assert!(
            unit["Service.SystemCallFilter"].contains(&"@system-service".to_owned()),
            "{file}"
        );
        let exec_start = one("Service.ExecStart");
        assert!(
            exec_start.starts_with(&format!("/usr/local/bin/{binary} serve ")),
            "{file}: {exec_start}"
        );
        assert_eq!(
            one("Service.KillSignal"),
            stop_signal,
            "{file}: how {binary} stops gracefully"
        );
        // ProtectSystem=strict: the only writable place is the state directory.
        assert!(
            unit.contains_key("Service.StateDirectory"),
            "{file}: needs a writable state dir"
        );
        assert_eq!(one("Install.WantedBy"), "multi-user.target");
    }
    // The example node config writes its data where tally-node.service may write.
    let example = read("deploy/systemd/tally-node.toml.example");
    let state = unit("deploy/systemd/tally-node.service")["Service.StateDirectory"][0].clone();
    assert!(
        example.contains(&format!("data_dir = \"/var/lib/{state}\"")),
        "data_dir under StateDirectory"
    );
    let fields = struct_fields("authority/src/node/config.rs", "NodeConfig");
    let tls = struct_fields("tls/src/files.rs", "TlsFiles");
    let mut in_tls = false;
    for line in example
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        if line.starts_with('[') {
            in_tls = line == "[tls]";
            continue;
        }
        let key = line.split_once('=').expect("key = value").0.trim();
        let known = if in_tls {
            tls.contains(key)
        } else {
            fields.contains(key)
        };
        assert!(known, "tally-node.toml.example: {key} is not a setting");
    }
    assert!(read("deploy/systemd/tally.sysusers.conf").contains("u tally "));
}
