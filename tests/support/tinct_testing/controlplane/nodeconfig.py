"""The end-to-end node's configuration files and cluster objects, as pure functions.

Every setting here is one a node on this kind of machine needs (hybrid cgroup v1, no
systemd, no CAP_SYS_RESOURCE, no registry), or one that keeps the node from touching
the host beyond what teardown undoes; the comments say which. ``node.py`` writes these
files under the node's run directory and starts the processes on them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

NODE_NAME = "tinct-e2e-node"
BRIDGE = "cni-tinct0"
POD_CIDR = "10.88.0.0/24"
POD_GATEWAY = "10.88.0.1"
# In the harness's Service range (10.0.0.0/24); 10.0.0.1 is the kubernetes Service.
DNS_SERVICE_IP = "10.0.0.10"
CLUSTER_DOMAIN = "cluster.local"
# The cgroup every Pod of the node lives under, in each hierarchy; the node creates it and
# teardown removes it with everything below.
CGROUP_ROOT = "tinct-node"
MAX_PODS = 60


@dataclass(frozen=True)
class Ports:
    """The node's listening ports: free ones, so nothing else on the machine is in the way."""

    kubelet: int
    kubelet_healthz: int
    proxy_healthz: int
    proxy_metrics: int
    scheduler: int
    dns: int
    dns_ready: int
    metrics_server: int


def containerd_config(run: Path, root: Path, pause_ref: str) -> str:
    """containerd's config (version 3): state under ``run``, images under ``root`` (a cache)."""
    sock = run / "containerd" / "containerd.sock"
    return f"""version = 4
root = "{root}"
state = "{run / "containerd" / "state"}"
# Nothing from /etc/containerd: this containerd is the node's alone.
imports = []

[plugins]
  # Its sockets in the node's directory, not /run/containerd (another containerd's place).
  [plugins.'io.containerd.server.v1.grpc']
    address = "{sock}"
  [plugins.'io.containerd.server.v1.ttrpc']
    address = "{sock}.ttrpc"
  [plugins.'io.containerd.internal.v1.opt']
    path = "{run / "containerd" / "opt"}"
  # No NRI plugins here; it would make /var/run/nri.
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      # No registry here: the sandbox image is imported, and never pulled.
      sandbox = '{pause_ref}'
  [plugins.'io.containerd.cri.v1.runtime']
    netns_mounts_under_state_dir = true
    # Processes here lack CAP_SYS_RESOURCE: without this every sandbox fails with
    # "can't get final child's PID from pipe" (runc cannot lower oom_score_adj below ours).
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        disable_pause_image_pull = true
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '/usr/sbin/runc'
          Root = '{run / "runc"}'
          # No systemd: cgroups are plain directories (kubelet's cgroupfs driver).
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['/usr/lib/cni']
      conf_dir = '{run / "cni" / "net.d"}'
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
"""


def cni_config(run: Path) -> str:
    """One bridge network for the node's Pods (the Debian plugins in /usr/lib/cni)."""
    doc = {
        "cniVersion": "1.0.0",
        "name": "tinct",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": True,
                # A Pod reaching its own Service's IP may be sent back to itself.
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(run / "cni" / "ipam"),
                    "ranges": [[{"subnet": POD_CIDR, "gateway": POD_GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "loopback"},
        ],
    }
    return json.dumps(doc, indent=2)


def kubelet_config(run: Path, node_ip: str, ports: Ports, ca: Path) -> dict[str, Any]:
    """KubeletConfiguration for cgroup v1 without systemd, Pods of imported images only."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # No systemd to drive cgroups; Kubernetes >= 1.35 refuses cgroup v1 unless told.
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "cgroupRoot": f"/{CGROUP_ROOT}",
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{run / 'containerd' / 'containerd.sock'}",
        "address": node_ip,
        "port": ports.kubelet,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports.kubelet_healthz,
        # The API server and metrics-server present client certificates of the cluster CA;
        # what they may do is the API server's RBAC decision.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [DNS_SERVICE_IP],
        "resolvConf": "/etc/resolv.conf",
        "serializeImagePulls": False,
        # Imported images cannot be pulled again: never collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "maxPods": MAX_PODS,
        "podLogsDir": str(run / "kubelet" / "pod-logs"),
        # kube-proxy makes the rules Services need; the kubelet's own chains add nothing here.
        "makeIPTablesUtilChains": False,
        "nodeStatusUpdateFrequency": "4s",
    }


def kube_proxy_config(kubeconfig: Path, ports: Ports) -> dict[str, Any]:
    """KubeProxyConfiguration: iptables mode, leaving the machine's conntrack sysctls alone."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        "healthzBindAddress": f"127.0.0.1:{ports.proxy_healthz}",
        "metricsBindAddress": f"127.0.0.1:{ports.proxy_metrics}",
        # 0: do not set nf_conntrack_max and the TCP/UDP timeouts (host-wide sysctls).
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
            "udpTimeout": "0s",
            "udpStreamTimeout": "0s",
        },
        # True would set net.ipv4.conf.all.route_localnet=1 for NodePorts on 127.0.0.1.
        "iptables": {"localhostNodePorts": False},
    }


def corefile(node_ip: str, ports: Ports, kubeconfig: Path) -> str:
    """CoreDNS serving the cluster domain from the API, other names from the machine's resolver."""
    return f""".:{ports.dns} {{
    bind {node_ip}
    errors
    ready 127.0.0.1:{ports.dns_ready}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    forward . /etc/resolv.conf
    cache 5
}}
"""


def _external_service(name: str, ip: str | None, ports: list[dict[str, Any]]) -> dict[str, Any]:
    """A Service without a selector: its Endpoints name a process of the node itself."""
    spec: dict[str, Any] = {
        "ports": [
            {"name": p["name"], "port": p["port"], "protocol": p["protocol"], "targetPort": p["target"]}
            for p in ports
        ]
    }
    if ip:
        spec["clusterIP"] = ip
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "kube-system", "labels": {"tinct.io/e2e-node": "true"}},
        "spec": spec,
    }


def _endpoints(name: str, node_ip: str, ports: list[dict[str, Any]]) -> dict[str, Any]:
    """Endpoints of a Service served by a process of the node itself (mirrored into a slice)."""
    return {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": name, "namespace": "kube-system", "labels": {"tinct.io/e2e-node": "true"}},
        "subsets": [
            {
                "addresses": [{"ip": node_ip}],
                "ports": [{"name": p["name"], "port": p["target"], "protocol": p["protocol"]} for p in ports],
            }
        ],
    }


def dns_objects(node_ip: str, ports: Ports) -> list[dict[str, Any]]:
    """The kube-dns Service at :data:`DNS_SERVICE_IP`, sent to CoreDNS on the node's IP."""
    dns = [
        {"name": "dns", "port": 53, "protocol": "UDP", "target": ports.dns},
        {"name": "dns-tcp", "port": 53, "protocol": "TCP", "target": ports.dns},
    ]
    return [_external_service("kube-dns", DNS_SERVICE_IP, dns), _endpoints("kube-dns", node_ip, dns)]


def metrics_objects(node_ip: str, ports: Ports) -> list[dict[str, Any]]:
    """metrics.k8s.io served by metrics-server on the node's IP (the HPA's CPU metrics)."""
    https = [{"name": "https", "port": 443, "protocol": "TCP", "target": ports.metrics_server}]
    return [
        _external_service("metrics-server", None, https),
        _endpoints("metrics-server", node_ip, https),
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": "v1beta1.metrics.k8s.io", "labels": {"tinct.io/e2e-node": "true"}},
            "spec": {
                "service": {"name": "metrics-server", "namespace": "kube-system", "port": 443},
                "group": "metrics.k8s.io",
                "version": "v1beta1",
                # metrics-server serves a self-signed certificate.
                "insecureSkipTLSVerify": True,
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        },
    ]


def persistent_volume(name: str, path: Path, size: str = "10Gi") -> dict[str, Any]:
    """A static hostPath PV of no StorageClass: what a PVC without a provisioner binds to."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {"tinct.io/e2e-node": "true"}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": str(path), "type": "Directory"},
        },
    }


def dump(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


__all__ = [
    "BRIDGE",
    "CGROUP_ROOT",
    "CLUSTER_DOMAIN",
    "DNS_SERVICE_IP",
    "MAX_PODS",
    "NODE_NAME",
    "POD_CIDR",
    "POD_GATEWAY",
    "Ports",
    "cni_config",
    "containerd_config",
    "corefile",
    "dns_objects",
    "dump",
    "kube_proxy_config",
    "kubelet_config",
    "metrics_objects",
    "persistent_volume",
]
