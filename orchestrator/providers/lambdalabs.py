"""Lambda Cloud client: instance types with capacity, launch, instances, terminate.

Lambda has no stop state (an in-OS shutdown keeps billing), and no spot. Its terminate call
can hang: we bound it with a short client-side timeout, re-query the instance, and only then
retry, so a slow API never leaves a box billing nor double-fires.
"""

from __future__ import annotations

import os
import urllib.parse

from orchestrator.errors import ProviderError, Unsupported
from orchestrator.providers.base import CreateSpec, Instance, Offer, Provider, cheapest, gpu_matches

STATUS = {"booting": "pending", "active": "running", "unhealthy": "pending",
          "terminating": "terminated", "terminated": "terminated", "preempted": "preempted"}


class Lambda(Provider):
    name = "lambda"
    display = "Lambda Cloud"
    ssh_user = "ubuntu"
    stop_unsupported = ("Lambda Cloud has no stop state; terminate is the only way to stop billing "
                        "(an in-OS shutdown keeps billing)")
    terminate_timeout_s = 20.0
    terminate_attempts = 3

    def parse_error(self, status, body):
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            err = body["error"]
            msg = err.get("message", "")
            if err.get("suggestion"):
                msg = f"{msg} ({err['suggestion']})"
            return str(err.get("code", "")), str(msg)
        return super().parse_error(status, body)

    def is_credential_error(self, status, code, message):
        return code == "global/invalid-api-key"

    def is_capacity_error(self, status, code, message):
        return code.endswith("insufficient-capacity")

    def is_gone(self, inst: Instance) -> bool:
        return inst.state == "terminated" and inst.raw_status != "terminating"

    def check_credentials(self) -> None:
        self.http.request("GET", "/instance-types")

    def list_offers(self, gpu, count=1, spot=False, max_price=None):
        if spot:
            raise Unsupported("Lambda Cloud has no spot or interruptible instances",
                              hint="drop --spot")
        _, body = self.http.request("GET", "/instance-types")
        offers = []
        for type_name, entry in ((body or {}).get("data") or {}).items():
            it = entry.get("instance_type") or {}
            gpus = int((it.get("specs") or {}).get("gpus") or 0)
            label = it.get("gpu_description") or it.get("description") or type_name
            if gpus != count or not (gpu_matches(gpu, label) or gpu_matches(gpu, type_name)):
                continue
            for region in entry.get("regions_with_capacity_available") or []:
                offers.append(Offer(id=f"{type_name}@{region['name']}", gpu=label, count=gpus,
                                    price_per_hour=int(it.get("price_cents_per_hour", 0)) / 100.0,
                                    spot=False, region=region["name"], provider=self.name))
        return cheapest(offers, max_price)

    def _ssh_key_name(self, spec: CreateSpec) -> str:
        name = spec.ssh_key_name or self.extras.get("ssh_key_name")
        if name:
            return str(name)
        _, body = self.http.request("GET", "/ssh-keys")
        keys = (body or {}).get("data") or []
        if not keys:
            raise ProviderError("Lambda Cloud: the account has no SSH key; launch needs exactly one",
                                hint="add one in the Lambda console, or set api.ssh_key_name")
        return str(keys[0]["name"])

    def create(self, spec: CreateSpec) -> Instance:
        if spec.spot:
            raise Unsupported("Lambda Cloud has no spot or interruptible instances", hint="drop --spot")
        type_name, _, region = (spec.offer_id or "").partition("@")
        if not type_name or not region:
            raise ProviderError("Lambda Cloud: create needs an offer (instance type @ region)",
                                hint="pick one from list_offers")
        body = {"region_name": region, "instance_type_name": type_name,
                "ssh_key_names": [self._ssh_key_name(spec)], "name": spec.name}
        _, resp = self.http.request("POST", "/instance-operations/launch", body)
        ids = ((resp or {}).get("data") or {}).get("instance_ids") or []
        if not ids:
            raise ProviderError("Lambda Cloud: launch answered without an instance id",
                                hint="check the Lambda console for a stray instance")
        for extra in ids[1:]:   # we asked for one; never leave a surplus box billing
            self._cleanup_half_created(str(extra))
        return Instance(provider=self.name, id=str(ids[0]), state="pending", name=spec.name,
                        ssh_user=self.ssh_user, region=region)

    def refresh(self, instance_id: str) -> Instance:
        status, body = self.http.request("GET", f"/instances/{urllib.parse.quote(instance_id)}",
                                         ok_404=True)
        if status == 404 or not body:
            return Instance(provider=self.name, id=instance_id, state="terminated", raw_status="404",
                            ssh_user=self.ssh_user)
        return self._instance(body["data"])

    def list_instances(self) -> list[Instance]:
        _, body = self.http.request("GET", "/instances")
        return [self._instance(d) for d in (body or {}).get("data") or []]

    def terminate(self, instance_id: str) -> None:
        last: ProviderError | None = None
        for _ in range(self.terminate_attempts):
            try:
                self.http.request("POST", "/instance-operations/terminate",
                                  {"instance_ids": [instance_id]}, timeout=self.terminate_timeout_s)
                return
            except ProviderError as exc:
                if exc.status not in (None, 404, 400) and not exc.retryable:
                    raise
                last = exc
            # no answer, or the API objects: ask what really happened before firing again
            inst = self.refresh(instance_id)
            if inst.state == "terminated":
                return
        raise ProviderError(f"Lambda Cloud: terminate of {instance_id} did not take effect "
                            f"after {self.terminate_attempts} tries ({last})",
                            hint="terminate it in the Lambda console; it is still billing",
                            retryable=True)

    def _ssh_port(self) -> int:
        """Always 22 on Lambda; overridable (``api.ssh_port`` or env) for a forwarded port."""
        return int(self.extras.get("ssh_port") or os.environ.get("GPURUN_LAMBDA_SSH_PORT") or 22)

    def _instance(self, d: dict) -> Instance:
        raw = str(d.get("status") or "")
        state = STATUS.get(raw, "pending")
        ip = d.get("ip") or None
        if state == "running" and not ip:
            state = "pending"
        it = d.get("instance_type") or {}
        cents = it.get("price_cents_per_hour")
        return Instance(
            provider=self.name, id=str(d["id"]), state=state, name=d.get("name") or "",
            gpu=it.get("gpu_description") or it.get("description") or it.get("name") or "",
            count=int((it.get("specs") or {}).get("gpus") or 0),
            price_per_hour=int(cents) / 100.0 if cents is not None else None, spot=False,
            region=(d.get("region") or {}).get("name"), ssh_host=ip,
            ssh_port=self._ssh_port() if ip else None,
            ssh_user=self.ssh_user, raw_status=raw)
