"""AutoDL client: the developer-token API for *Pro* container instances (create, list, snapshot,
power on/off, release) and the region GPU stock. Ordinary instances have no API: they are plain
SSH hosts whose meter-stop verb is the in-instance ``/usr/bin/shutdown``.

Logical errors arrive as HTTP 200 with ``code != "Success"``; only the code/msg tell a bad token,
an empty stock or a missing instance apart. Paths and field names follow community clients of
the Pro API (the official page for it could not be opened); prices are CNY.
"""

from __future__ import annotations

from urllib.parse import quote

from orchestrator.errors import ProviderError, Unsupported
from orchestrator.providers.base import (CreateSpec, Instance, Offer, Provider, cheapest,
                                         gpu_matches, parse_time)

PRO = "/api/v1/dev/instance/pro"
NOT_FOUND = ("InstanceNotFound", "NotFound", "InstanceNotExist")
STATUS = {"creating": "pending", "starting": "pending", "re_initializing": "pending",
          "running": "running", "shutting_down": "stopped", "shutdown": "stopped",
          "stopped": "stopped", "releasing": "terminated", "released": "terminated"}
ORDINARY = ("ordinary AutoDL instances have no API; gpurun treats them as SSH hosts whose "
            "meter-stop verb is the in-instance /usr/bin/shutdown")


class AutoDL(Provider):
    name = "autodl"
    display = "AutoDL"
    stopped_bills = ("a powered-off AutoDL instance bills a small data-disk fee and is released "
                     "(data disk gone) after 15 days off")

    def auth_headers(self, key: str) -> dict:
        return {"Authorization": key}   # raw token, no "Bearer"

    def envelope_error(self, payload):
        if isinstance(payload, dict) and "code" in payload:
            code = str(payload.get("code"))
            if code != "Success" and code not in NOT_FOUND:
                return code, str(payload.get("msg") or "")
        return None

    def is_credential_error(self, status, code, message):
        m = message.lower()
        return "auth" in code.lower() or "token" in code.lower() or "token" in m or "鉴权" in m

    def is_capacity_error(self, status, code, message):
        return "stock" in code.lower() or "stock" in message.lower() or "库存" in message

    def is_gone(self, inst: Instance) -> bool:
        return inst.state == "terminated" and inst.raw_status != "releasing"

    def check_credentials(self) -> None:
        self.http.request("POST", "/api/v1/dev/wallet/balance", {})

    def list_offers(self, gpu, count=1, spot=False, max_price=None):
        if spot:
            raise Unsupported("AutoDL has no spot or interruptible instances", hint="drop --spot")
        prices = self.extras.get("prices") or {}
        offers = []
        for region in self.extras.get("regions") or ["westDC2"]:
            _, body = self.http.request("POST", "/api/v1/dev/machine/region/gpu_stock",
                                        {"region_sign": region})
            for row in (body or {}).get("data") or []:
                for gpu_name, stock in row.items():
                    if not gpu_matches(gpu, gpu_name) or int(stock.get("idle_gpu_num", 0)) < count:
                        continue
                    per_gpu = float(prices.get(gpu_name, 0.0))
                    offers.append(Offer(id=f"{gpu_name}@{region}", gpu=gpu_name, count=count,
                                        price_per_hour=per_gpu * count, spot=False, region=region,
                                        provider=self.name, currency="CNY"))
        return cheapest(offers, max_price)

    def create(self, spec: CreateSpec) -> Instance:
        if spec.spot:
            raise Unsupported("AutoDL has no spot or interruptible instances", hint="drop --spot")
        gpu_name, _, region = (spec.offer_id or spec.gpu).partition("@")
        specs = self.extras.get("gpu_specs") or {}
        body = {"req_gpu_amount": spec.count,
                "gpu_spec_uuid": specs.get(gpu_name) or gpu_name.lower().replace(" ", "-"),
                "image_uuid": spec.image or self.extras.get("image") or "base-image-pytorch",
                "cuda_v_from": int(self.extras.get("cuda_v_from", 118)),
                "expand_system_disk_by_gb": max(0, int(spec.disk_gb) - 30),
                "data_center_list": [region] if region else list(self.extras.get("regions") or []),
                "instance_name": spec.name, "start_command": ""}
        _, resp = self.http.request("POST", f"{PRO}/create", body)
        uuid = (resp or {}).get("data")
        if not uuid or not isinstance(uuid, str):
            raise ProviderError("AutoDL: create answered without an instance uuid",
                                hint="check the AutoDL console for a stray instance")
        return Instance(provider=self.name, id=uuid, state="pending", name=spec.name,
                        region=region or None, currency="CNY")

    def refresh(self, instance_id: str) -> Instance:
        _, body = self.http.request("GET", f"{PRO}/snapshot?instance_uuid={quote(instance_id)}")
        if not isinstance(body, dict) or body.get("code") in NOT_FOUND or not body.get("data"):
            return Instance(provider=self.name, id=instance_id, state="terminated", raw_status="gone",
                            currency="CNY")
        return self._instance(body["data"])

    def list_instances(self) -> list[Instance]:
        out, page = [], 1
        while True:
            _, body = self.http.request("POST", f"{PRO}/list", {"page_index": page, "page_size": 100})
            data = (body or {}).get("data") or {}
            out += [self._instance(d) for d in data.get("list") or []]
            if page >= int(data.get("max_page") or 1):
                return out
            page += 1

    def stop(self, instance_id: str) -> None:
        self.http.request("POST", f"{PRO}/power_off", {"instance_uuid": instance_id})

    def start(self, instance_id: str) -> None:
        self.http.request("POST", f"{PRO}/power_on", {"instance_uuid": instance_id, "payload": "gpu"})

    def terminate(self, instance_id: str) -> None:
        inst = self.refresh(instance_id)
        if inst.state == "terminated":
            return
        if inst.raw_status != "shutdown":
            # release is refused while powered on; power off first and wait for it
            self.stop(instance_id)
            self.wait_state(instance_id, lambda i: i.raw_status in ("shutdown", "released"),
                            timeout=max(60.0, self.config.timeout_s * 4))
        self.http.request("POST", f"{PRO}/release", {"instance_uuid": instance_id})

    def _instance(self, d: dict) -> Instance:
        raw = str(d.get("status") or "")
        state = STATUS.get(raw, "pending")
        host, port = d.get("proxy_host") or None, d.get("ssh_port") or None
        if state == "running" and not (host and port):
            state = "pending"
        price = d.get("payg_price")
        return Instance(
            provider=self.name, id=str(d.get("instance_uuid") or d.get("uuid")), state=state,
            name=d.get("instance_name") or "", gpu=d.get("gpu_name") or "",
            count=int(d.get("req_gpu_amount") or 0),
            price_per_hour=float(price) / 1000.0 if price is not None else None,
            region=d.get("region_sign"), ssh_host=host, ssh_port=int(port) if port else None,
            ssh_user="root", started_at=parse_time(d.get("started_at")), raw_status=raw,
            currency="CNY")


def ordinary_instance_reason() -> str:
    """Why ``gpurun up autodl`` cannot rent an ordinary instance; shown by the CLI."""
    return ORDINARY
