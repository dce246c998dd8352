"""RunPod client: REST v1 pods (create/get/list/stop/start/delete), GraphQL only for GPU prices.

Full SSH only (public IP + the port mapped to 22): the ``ssh.runpod.io`` proxy has no SFTP, so
rsync and fabric put/get would fail on it. A DELETE ack is not proof: ``wait_gone`` polls to 404.
"""

from __future__ import annotations

import urllib.parse

from orchestrator.errors import ProviderError
from orchestrator.providers.base import (CreateSpec, Instance, Offer, Provider, cheapest,
                                         gpu_matches, parse_time)

DEFAULT_IMAGE = "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04"
GPU_QUERY = ("query GpuTypes { gpuTypes { id displayName memoryInGb securePrice communityPrice "
             "secureSpotPrice communitySpotPrice } }")


class RunPod(Provider):
    name = "runpod"
    display = "RunPod"
    stopped_bills = "a stopped pod still bills its volume disk at 2x ($0.20/GB/month)"

    def graphql_url(self) -> str:
        """GraphQL lives on another host in production; beside the REST base for a custom URL."""
        base = self.config.base_url.rstrip("/")
        if "rest.runpod.io" in base:
            return "https://api.runpod.io/graphql"
        parts = urllib.parse.urlsplit(base)
        return f"{parts.scheme}://{parts.netloc}/graphql"

    def envelope_error(self, payload):
        if isinstance(payload, dict) and payload.get("errors"):
            first = payload["errors"][0]
            return "graphql", str(first.get("message", first) if isinstance(first, dict) else first)
        return None

    def parse_error(self, status, body):
        if isinstance(body, dict):
            return "", str(body.get("error") or body.get("message") or "")
        return "", str(body or "")[:200]

    def is_capacity_error(self, status, code, message):
        m = message.lower()
        return "no longer any instances available" in m or "not enough" in m or "no gpu" in m \
            or "could not find any pods" in m

    def check_credentials(self) -> None:
        self.http.request("GET", "/pods")

    def list_offers(self, gpu, count=1, spot=False, max_price=None):
        _, data = self.http.request("POST", self.graphql_url(), {"query": GPU_QUERY, "variables": {}})
        offers = []
        for t in (data or {}).get("data", {}).get("gpuTypes", []) or []:
            if not (gpu_matches(gpu, t.get("id", "")) or gpu_matches(gpu, t.get("displayName", ""))):
                continue
            for cloud in ("secure", "community"):
                price = t.get(f"{cloud}SpotPrice" if spot else f"{cloud}Price")
                if not price:
                    continue
                offers.append(Offer(id=f"{t['id']}|{cloud.upper()}", gpu=t.get("displayName") or t["id"],
                                    count=count, price_per_hour=round(float(price) * count, 4),
                                    spot=spot, region=cloud.upper(), provider=self.name))
        return cheapest(offers, max_price)

    def create(self, spec: CreateSpec) -> Instance:
        gpu_type, _, cloud = (spec.offer_id or spec.gpu).partition("|")
        body = {
            "name": spec.name, "imageName": spec.image or self.extras.get("image") or DEFAULT_IMAGE,
            "gpuTypeIds": [gpu_type], "gpuCount": spec.count, "cloudType": cloud or "SECURE",
            "computeType": "GPU", "containerDiskInGb": 50, "volumeInGb": spec.disk_gb,
            "volumeMountPath": "/workspace", "ports": ["22/tcp"], "supportPublicIp": True,
            "interruptible": bool(spec.spot), "env": dict(spec.env),
        }
        if spec.ssh_public_key:
            body["env"]["PUBLIC_KEY"] = spec.ssh_public_key
        _, pod = self.http.request("POST", "/pods", body)
        if not isinstance(pod, dict) or not pod.get("id"):
            raise ProviderError("RunPod: create answered without a pod id",
                                hint="check the RunPod console for a stray pod")
        try:
            return self._instance(pod)
        except (KeyError, TypeError, ValueError) as exc:
            self._cleanup_half_created(pod["id"])
            raise ProviderError(f"RunPod: unreadable pod {pod['id']} after create ({exc})",
                                hint="the pod was terminated again; retry") from None

    def refresh(self, instance_id: str) -> Instance:
        status, pod = self.http.request("GET", f"/pods/{urllib.parse.quote(instance_id)}", ok_404=True)
        if status == 404 or not pod:
            return Instance(provider=self.name, id=instance_id, state="terminated", raw_status="404")
        return self._instance(pod)

    def list_instances(self) -> list[Instance]:
        _, pods = self.http.request("GET", "/pods")
        return [self._instance(p) for p in pods or []]

    def stop(self, instance_id: str) -> None:
        self.http.request("POST", f"/pods/{urllib.parse.quote(instance_id)}/stop")

    def start(self, instance_id: str) -> None:
        self.http.request("POST", f"/pods/{urllib.parse.quote(instance_id)}/start")

    def terminate(self, instance_id: str) -> None:
        self.http.request("DELETE", f"/pods/{urllib.parse.quote(instance_id)}", ok_404=True)

    def _instance(self, pod: dict) -> Instance:
        desired = str(pod.get("desiredStatus") or "").upper()
        ip = pod.get("publicIp") or None
        port = (pod.get("portMappings") or {}).get("22")
        spot = bool(pod.get("interruptible"))
        if desired == "TERMINATED":
            state = "terminated"
        elif desired == "EXITED":
            # an interruptible pod exits on its own only when reclaimed; a stop we sent
            # ourselves is told apart by the caller's own record (core/rent.py)
            state = "preempted" if spot else "stopped"
        elif desired == "RUNNING":
            state = "running" if ip and port else "pending"
        else:
            state = "pending"
        gpu = pod.get("gpu") or {}
        price = pod.get("adjustedCostPerHr", pod.get("costPerHr"))
        return Instance(
            provider=self.name, id=str(pod["id"]), state=state, name=pod.get("name") or "",
            gpu=gpu.get("displayName") or gpu.get("id") or "", count=int(gpu.get("count") or 0),
            price_per_hour=float(price) if price is not None else None, spot=spot,
            region=(pod.get("machine") or {}).get("dataCenterId"),
            ssh_host=ip, ssh_port=int(port) if port else None, ssh_user="root",
            started_at=parse_time(pod.get("lastStartedAt")), raw_status=desired)
