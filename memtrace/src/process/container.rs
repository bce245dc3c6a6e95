//! The container a memory cgroup path belongs to, as container runtimes and
//! Kubernetes name their groups: Docker (cgroupfs and systemd drivers),
//! containerd and CRI-O under the kubelet (both drivers), Podman; the pod's
//! uid and QoS class where the path has them. The path is all there is: no
//! runtime is asked, so it works the same on a node and in a record.

/// What a cgroup path says of its container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    /// docker, containerd, crio, podman, or cri (a kubelet cgroupfs path,
    /// which does not name the runtime).
    pub runtime: &'static str,
    /// The container id: 64 hex digits.
    pub id: String,
    pub pod_uid: Option<String>,
    /// guaranteed, burstable or besteffort, for a pod.
    pub qos: Option<&'static str>,
}

fn is_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A systemd scope of a container: `PREFIX-ID.scope`.
fn scope(c: &str) -> Option<(&'static str, &str)> {
    let unit = c.strip_suffix(".scope")?;
    const PREFIXES: [(&str, &str); 5] = [
        ("docker-", "docker"),
        ("cri-containerd-", "containerd"),
        ("crio-", "crio"),
        ("libpod-", "podman"),
        ("containerd-", "containerd"),
    ];
    PREFIXES.iter().find_map(|(p, rt)| {
        unit.strip_prefix(p)
            .filter(|id| is_id(id))
            .map(|id| (*rt, id))
    })
}

/// A pod's group: `pod<uid>` (cgroupfs) or `kubepods[-QOS]-pod<uid>.slice`
/// (systemd, with the uid's dashes as underscores).
fn pod(c: &str) -> Option<String> {
    let uid = match c.strip_suffix(".slice") {
        Some(unit) => unit.rsplit_once("-pod")?.1.replace('_', "-"),
        None => c.strip_prefix("pod")?.to_string(),
    };
    (uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')).then_some(uid)
}

fn qos(c: &str) -> Option<&'static str> {
    match c.trim_end_matches(".slice") {
        "burstable" | "kubepods-burstable" => Some("burstable"),
        "besteffort" | "kubepods-besteffort" => Some("besteffort"),
        _ => None,
    }
}

/// The container of cgroup `path` (as /proc/PID/cgroup gives it), if any.
pub fn of_cgroup(path: &str) -> Option<Container> {
    let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let kube = parts.iter().any(|c| c.starts_with("kubepods"));
    let mut found = None;
    let (mut pod_uid, mut class) = (None, None);
    for (i, c) in parts.iter().enumerate() {
        if let Some(q) = qos(c) {
            class = Some(q);
        }
        if kube && pod_uid.is_none() {
            pod_uid = pod(c);
        }
        if let Some((rt, id)) = scope(c) {
            found = Some((rt, id.to_string()));
        } else if is_id(c) {
            // cgroupfs: /docker/ID, or the kubelet's /kubepods/.../podUID/ID.
            let rt = match i.checked_sub(1).map(|j| parts[j]) {
                Some("docker") => "docker",
                _ if kube => "cri",
                _ => continue,
            };
            found = Some((rt, c.to_string()));
        }
    }
    let (runtime, id) = found?;
    let qos = pod_uid.as_ref().map(|_| class.unwrap_or("guaranteed"));
    Some(Container {
        runtime,
        id,
        pod_uid,
        qos,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f1c2a9b8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a";
    const UID: &str = "5e0c5d3e-7f2a-4b6c-9d8e-1a2b3c4d5e6f";

    fn c(path: &str) -> Option<Container> {
        of_cgroup(path)
    }

    #[test]
    fn docker_both_drivers() {
        let want = |rt| {
            Some(Container {
                runtime: rt,
                id: ID.into(),
                pod_uid: None,
                qos: None,
            })
        };
        assert_eq!(c(&format!("/docker/{ID}")), want("docker"));
        assert_eq!(
            c(&format!("/system.slice/docker-{ID}.scope")),
            want("docker")
        );
    }

    #[test]
    fn kubelet_cgroupfs_paths_give_pod_and_qos() {
        let got = c(&format!("/kubepods/burstable/pod{UID}/{ID}")).unwrap();
        assert_eq!((got.runtime, got.id.as_str()), ("cri", ID));
        assert_eq!(got.pod_uid.as_deref(), Some(UID));
        assert_eq!(got.qos, Some("burstable"));
        // Guaranteed pods sit right under kubepods.
        let got = c(&format!("/kubepods/pod{UID}/{ID}")).unwrap();
        assert_eq!(got.qos, Some("guaranteed"));
    }

    #[test]
    fn kubelet_systemd_paths_containerd_and_crio() {
        let under = UID.replace('-', "_");
        let p = format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{under}.slice/cri-containerd-{ID}.scope"
        );
        let got = c(&p).unwrap();
        assert_eq!((got.runtime, got.qos), ("containerd", Some("besteffort")));
        assert_eq!(got.pod_uid.as_deref(), Some(UID));
        let p = format!("/kubepods.slice/kubepods-pod{under}.slice/crio-{ID}.scope");
        let got = c(&p).unwrap();
        assert_eq!((got.runtime, got.qos), ("crio", Some("guaranteed")));
        // CRI-O's monitor is not the container.
        let p = format!("/kubepods.slice/kubepods-pod{under}.slice/crio-conmon-{ID}.scope");
        assert_eq!(c(&p), None);
    }

    #[test]
    fn podman_rootful_and_rootless() {
        let got = c(&format!("/machine.slice/libpod-{ID}.scope")).unwrap();
        assert_eq!(got.runtime, "podman");
        let p =
            format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope");
        assert_eq!(c(&p).unwrap().id, ID);
        // A container's own sub-group still names it.
        let p = format!("/machine.slice/libpod-{ID}.scope/container");
        assert_eq!(c(&p).unwrap().id, ID);
    }

    #[test]
    fn hosts_services_and_short_names_are_no_container() {
        for p in [
            "/",
            "/system.slice/sshd.service",
            "/user.slice/user-0.slice/session-3.scope",
            "/docker/abc123",
            "/process_api/3726267fa31cb30cf17b70578c37dd70",
        ] {
            assert_eq!(c(p), None, "{p}");
        }
    }
}
