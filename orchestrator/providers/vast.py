"""Vast.ai client: search offers (bundles), create on an offer (asks), instances, stop, destroy.

Bid (spot) instances are paused without notice when outbid; ``actual_status`` says stopped
while ``intended_status`` still says running, which is how we tell preemption from a stop.
Destroy is eventually consistent: the instance is still shown as ``exited`` for a while.
"""

from __future__ import annotations

from urllib.parse import quote

from orchestrator.errors import ProviderError
from orchestrator.providers.base import (CreateSpec, Instance, Offer, Provider, cheapest,
                                         gpu_matches, parse_time)

DEFAULT_IMAGE = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-devel"
PENDING = {None, "", "created", "loading", "scheduling", "init"}
DOWN = {"stopped", "exited", "offline", "inactive", "paused"}


class Vast(Provider):
    name = "vast"
    display = "Vast.ai"
    stopped_bills = "a stopped Vast.ai instance bills its disk forever, until destroyed"

    def parse_error(self, status, body):
        if isinstance(body, dict):
            return str(body.get("error") or ""), str(body.get("msg") or body.get("message") or "")
        return super().parse_error(status, body)

    def envelope_error(self, payload):
        if isinstance(payload, dict) and payload.get("success") is False:
            return self.parse_error(200, payload)
        return None

    def is_capacity_error(self, status, code, message):
        m = message.lower()
        return code in ("no_such_ask", "ask_not_available") or "no longer available" in m

    def is_credential_error(self, status, code, message):
        return code in ("invalid_api_key", "auth_error")

    def check_credentials(self) -> None:
        self.http.request("GET", "/users/current/")

    def list_offers(self, gpu, count=1, spot=False, max_price=None):
        query = {"verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True},
                 "rented": {"eq": False}, "num_gpus": {"eq": int(count)},
                 "gpu_name": {"eq": gpu.replace("_", " ")}, "direct_port_count": {"gte": 1},
                 "order": [["dph_total", "asc"]], "type": "bid" if spot else "on-demand", "limit": 64}
        _, body = self.http.request("POST", "/bundles/", query)
        offers = []
        for o in (body or {}).get("offers") or []:
            if not gpu_matches(gpu, str(o.get("gpu_name", ""))):
                continue
            price = o.get("min_bid") if spot else o.get("dph_total")
            if price is None:
                continue
            offers.append(Offer(id=str(o["id"]), gpu=str(o.get("gpu_name")), count=int(o.get("num_gpus", 0)),
                                price_per_hour=float(price), spot=spot,
                                region=o.get("geolocation"), provider=self.name))
        return cheapest(offers, max_price)

    def create(self, spec: CreateSpec) -> Instance:
        if not spec.offer_id:
            raise ProviderError("Vast.ai: create needs an offer id from list_offers",
                                hint="run `gpurun up` without --offer to pick the cheapest")
        body = {"client_id": "me", "image": spec.image or self.extras.get("image") or DEFAULT_IMAGE,
                "disk": spec.disk_gb, "label": spec.name, "runtype": "ssh_direc ssh_proxy",
                "env": dict(spec.env), "onstart": "touch ~/.no_auto_tmux"}
        if spec.spot:
            if spec.max_price is None:
                raise ProviderError("Vast.ai: a bid instance needs --max-price (the bid, $/h)",
                                    hint="the bid is fixed at creation; pass --max-price")
            body["price"] = float(spec.max_price)
        _, resp = self.http.request("PUT", f"/asks/{spec.offer_id}/", body)
        new_id = (resp or {}).get("new_contract")
        if not new_id:
            raise ProviderError("Vast.ai: create answered without an instance id",
                                hint="check the Vast console for a stray instance")
        return Instance(provider=self.name, id=str(new_id), state="pending", name=spec.name,
                        spot=spec.spot)

    def refresh(self, instance_id: str) -> Instance:
        status, body = self.http.request("GET", f"/instances/{quote(str(instance_id))}/",
                                         query={"owner": "me"}, ok_404=True)
        inst = (body or {}).get("instances") if isinstance(body, dict) else None
        if status == 404 or not inst:
            return Instance(provider=self.name, id=instance_id, state="terminated", raw_status="gone")
        return self._instance(inst)

    def list_instances(self) -> list[Instance]:
        _, body = self.http.request("GET", "/instances/", query={"owner": "me"})
        return [self._instance(d) for d in (body or {}).get("instances") or []]

    def stop(self, instance_id: str) -> None:
        self.http.request("PUT", f"/instances/{quote(str(instance_id))}/", {"state": "stopped"})

    def start(self, instance_id: str) -> None:
        self.http.request("PUT", f"/instances/{quote(str(instance_id))}/", {"state": "running"})

    def terminate(self, instance_id: str) -> None:
        self.http.request("DELETE", f"/instances/{quote(str(instance_id))}/", ok_404=True)

    def _instance(self, d: dict) -> Instance:
        actual = d.get("actual_status")
        intended = d.get("intended_status")
        if actual in PENDING:
            state = "pending"
        elif actual == "running":
            state = "running"
        elif actual in DOWN:
            # the user asked for running, the box is down: outbid or host lost
            state = "preempted" if intended == "running" else "stopped"
        else:
            state = "pending"
        host, port = self._ssh(d)
        if state == "running" and not (host and port):
            state = "pending"
        return Instance(
            provider=self.name, id=str(d["id"]), state=state, name=d.get("label") or "",
            gpu=d.get("gpu_name") or "", count=int(d.get("num_gpus") or 0),
            price_per_hour=float(d["dph_total"]) if d.get("dph_total") is not None else None,
            spot=bool(d.get("is_bid")), region=d.get("geolocation"), ssh_host=host, ssh_port=port,
            ssh_user="root", started_at=parse_time(d.get("start_date")), raw_status=str(actual))

    @staticmethod
    def _ssh(d: dict) -> tuple[str | None, int | None]:
        """Direct SSH (public IP + mapped 22) when offered; the proxy is slow for bulk copies."""
        mapped = ((d.get("ports") or {}).get("22/tcp") or [None])[0]
        if d.get("public_ipaddr") and mapped and mapped.get("HostPort"):
            return str(d["public_ipaddr"]).strip(), int(mapped["HostPort"])
        if d.get("ssh_host") and d.get("ssh_port"):
            return str(d["ssh_host"]), int(d["ssh_port"])
        return None, None
