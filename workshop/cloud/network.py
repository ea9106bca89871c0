"""The workshop network: one VPC per user, created or reused, found again by its tags.

`ensure_network()` creates or reuses: one private subnet in ONE availability zone (the
instances of a distributed job talk to each other every step; within one AZ that traffic is
fast and free, across AZs it costs $0.01/GB each way and adds latency), a security group that
admits all traffic from itself and nothing else (the hosts of a job, and the interface
endpoints, are its only members), an S3 gateway endpoint on the subnet's route table (free),
and a way out for what a job in that subnet needs: `egress="endpoints"` (default): interface
endpoints for ECR (api, dkr), CloudWatch Logs and STS; `egress="nat"`: a NAT gateway in a
public subnet of the same AZ (the only choice that reaches PyPI, e.g. for a `requirements.txt`).
Their hourly prices are in `workshop.cloud.prices.NETWORK_PRICES`.
"""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workshop.cloud import aws
from workshop.cloud.common import (
    POLL_S,
    TAG_STACK,
    aws_error,
    code_of,
    poll,
    say,
    tag_spec,
    user_filters,
)
from workshop.cloud.prices import NETWORK_PRICES
from workshop.errors import WorkshopError

DEFAULT_CIDR = "10.87.0.0/16"


EGRESS_CHOICES = ("endpoints", "nat")


# Interface endpoints a training job in a private subnet needs, by service suffix: image
# pulls (ECR API + Docker registry; the layers themselves come from S3 through the gateway
# endpoint), CloudWatch Logs, and STS (boto3 inside the container resolves regional STS).
# Add "sagemaker.api" through `extra_endpoints` if a script calls SageMaker itself.
INTERFACE_ENDPOINTS = ("ecr.api", "ecr.dkr", "logs", "sts")


NETWORK_TIMEOUT_S = 600.0


def network_hourly_usd(egress: str | None, extra_endpoints: Sequence[str] = ()) -> float:
    """What the workshop network costs per hour it exists (data processing not included)."""
    if not egress:
        return 0.0
    if egress == "nat":
        return NETWORK_PRICES["nat_gateway"].usd_per_hour + NETWORK_PRICES["public_ipv4"].usd_per_hour
    count = len(INTERFACE_ENDPOINTS) + len(extra_endpoints)
    return count * NETWORK_PRICES["interface_endpoint"].usd_per_hour


@dataclass
class Network:
    """The workshop network of one user, as found or created."""

    region: str
    vpc_id: str
    cidr: str
    availability_zone: str
    subnet_ids: list[str]
    security_group_id: str
    route_table_id: str
    s3_endpoint_id: str
    egress: str
    interface_endpoint_ids: dict[str, str] = field(default_factory=dict)
    nat_gateway_id: str | None = None
    created: list[str] = field(default_factory=list)  # ids this call created (empty: all reused)

    @property
    def security_group_ids(self) -> list[str]:
        return [self.security_group_id]

    def job_args(self) -> dict[str, list[str]]:
        """`subnets=` and `security_group_ids=` for `run_lab_on_sagemaker`/`build_trainer`."""
        return {"subnets": list(self.subnet_ids), "security_group_ids": self.security_group_ids}

    @property
    def hourly_usd(self) -> float:
        return network_hourly_usd(self.egress, [s for s in self.interface_endpoint_ids if s not in INTERFACE_ENDPOINTS])

    def lines(self) -> list[str]:
        way_out = (
            f"NAT gateway {self.nat_gateway_id}" if self.egress == "nat"
            else "interface endpoints " + ", ".join(f"{k}={v}" for k, v in self.interface_endpoint_ids.items())
        )
        state = f"created {len(self.created)} resource(s)" if self.created else "reused, nothing created"
        return [
            f"network: VPC {self.vpc_id} ({self.cidr}) in {self.region}, {state}",
            f"network: subnets {', '.join(self.subnet_ids)} in one AZ, {self.availability_zone}; "
            f"security group {self.security_group_id} (all traffic from itself only)",
            f"network: S3 gateway endpoint {self.s3_endpoint_id} on route table {self.route_table_id}; {way_out}",
            f"network: ${self.hourly_usd:.3f} per hour while it exists",
        ]


def _one(items: list[dict[str, Any]], what: str) -> dict[str, Any] | None:
    if len(items) > 1:
        raise WorkshopError(
            f"Found {len(items)} workshop {what}s for this user; expected one.",
            "run `python -m workshop cleanup` to remove them, then create the network again.",
        )
    return items[0] if items else None


def _find_vpc(ec2: Any, user: str) -> dict[str, Any] | None:
    return _one(ec2.describe_vpcs(Filters=user_filters(user, "vpc"))["Vpcs"], "VPC")


def _free_cidr(taken: Sequence[tuple[str, Any]]) -> ipaddress.IPv4Network | None:
    """The workshop's default block if no VPC overlaps it, else the first free 10.N.0.0/16."""
    candidates = [ipaddress.ip_network(DEFAULT_CIDR), *(ipaddress.ip_network(f"10.{i}.0.0/16") for i in range(80, 250))]
    return next((c for c in candidates if not any(c.overlaps(o) for _, o in taken)), None)


def _check_cidr(ec2: Any, cidr: str | None) -> ipaddress.IPv4Network:
    """`cidr`, checked against every VPC in the region; None: a free block, chosen here (each
    attendee in a shared account has a VPC of their own, and the next one must not overlap)."""
    if cidr is None:
        taken = _vpc_blocks(ec2)
        free = _free_cidr(taken)
        if free is None:
            raise WorkshopError("No free 10.N.0.0/16 block is left for a workshop VPC in this region.",
                                "pass cidr= (CLI: --cidr) with a block that overlaps no VPC, or delete unused VPCs.")
        return free
    try:
        net = ipaddress.ip_network(cidr)
    except ValueError:
        raise WorkshopError(f"Not an IPv4 CIDR block: {cidr!r}.", "pass e.g. cidr='10.87.0.0/16'.") from None
    if not isinstance(net, ipaddress.IPv4Network) or not 16 <= net.prefixlen <= 24:
        raise WorkshopError(f"The VPC CIDR must be IPv4, /16 to /24; got {cidr!r}.", "pass e.g. cidr='10.87.0.0/16'.")
    taken = _vpc_blocks(ec2)
    clash = next(((vpc_id, other) for vpc_id, other in taken if net.overlaps(other)), None)
    if clash:
        candidates = (ipaddress.ip_network(f"10.{i}.0.0/16") for i in range(80, 250))
        free = next((c for c in candidates if not any(c.overlaps(o) for _, o in taken)), None)
        raise WorkshopError(
            f"CIDR {cidr} overlaps VPC {clash[0]} ({clash[1]}) in this region.",
            f"pass a block that overlaps no VPC, e.g. cidr='{free}' (CLI: python -m workshop network --cidr {free}).",
        )
    return net


def _vpc_blocks(ec2: Any) -> list[tuple[str, Any]]:
    return [
        (vpc["VpcId"], ipaddress.ip_network(assoc["CidrBlock"]))
        for vpc in ec2.describe_vpcs()["Vpcs"]
        for assoc in vpc.get("CidrBlockAssociationSet") or [{"CidrBlock": vpc["CidrBlock"]}]
    ]


def _pick_az(ec2: Any, availability_zone: str | None) -> str:
    zones = sorted(
        z["ZoneName"] for z in ec2.describe_availability_zones(
            Filters=[{"Name": "state", "Values": ["available"]}]
        )["AvailabilityZones"] if z.get("ZoneType", "availability-zone") == "availability-zone"
    )
    if availability_zone:
        if availability_zone not in zones:
            raise WorkshopError(f"Availability zone {availability_zone!r} is not available here.",
                                f"choose one of: {', '.join(zones)}.")
        return availability_zone
    if not zones:
        raise WorkshopError("This region reports no available availability zone.", "choose another region.")
    return zones[0]


def _find_or_create(find: Callable[[], dict[str, Any] | None], create: Callable[[], dict[str, Any]],
                    created: list[str], id_key: str) -> dict[str, Any]:
    found = find()
    if found:
        return found
    item = create()
    created.append(item[id_key])
    return item


def ensure_network(
    session: Any = None,
    *,
    egress: str = "endpoints",
    cidr: str | None = None,
    availability_zone: str | None = None,
    extra_endpoints: Sequence[str] = (),
    user: str | None = None,
    timeout_s: float = NETWORK_TIMEOUT_S,
    poll_s: float = POLL_S,
) -> Network:
    """Create or reuse this user's workshop network (see the module docstring); idempotent.

    Each piece is looked up by its tags first, so a second call (or a call after a partial
    failure) creates only what is missing and returns the same ids. `cidr`: the new VPC's block;
    None: `DEFAULT_CIDR`, or, when another VPC in the region overlaps it (another attendee's
    workshop VPC in a shared account), the first free 10.N.0.0/16.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    if egress not in EGRESS_CHOICES:
        raise WorkshopError(f"egress must be one of {EGRESS_CHOICES}, got {egress!r}.",
                            "use 'endpoints' (default) or 'nat' (reaches the internet, e.g. PyPI).")
    boto = aws.as_boto_session(session)
    user = user or aws.user_prefix()
    region = boto.region_name
    ec2 = boto.client("ec2")
    created: list[str] = []
    try:
        vpc = _find_vpc(ec2, user)
        if vpc is None:
            net = _check_cidr(ec2, cidr)
            vpc = ec2.create_vpc(CidrBlock=str(net), TagSpecifications=tag_spec("vpc", user, "vpc"))["Vpc"]
            created.append(vpc["VpcId"])
            poll(lambda: _vpc_state(ec2, vpc["VpcId"]), f"VPC {vpc['VpcId']}", timeout_s, poll_s)
            # Private DNS names of interface endpoints need both.
            ec2.modify_vpc_attribute(VpcId=vpc["VpcId"], EnableDnsSupport={"Value": True})
            ec2.modify_vpc_attribute(VpcId=vpc["VpcId"], EnableDnsHostnames={"Value": True})
        vpc_id = vpc["VpcId"]
        blocks = list(ipaddress.ip_network(vpc["CidrBlock"]).subnets(new_prefix=min(28, ipaddress.ip_network(vpc["CidrBlock"]).prefixlen + 4)))
        in_vpc = [{"Name": "vpc-id", "Values": [vpc_id]}]

        def find(kind: str, call: str, key: str) -> Callable[[], dict[str, Any] | None]:
            return lambda: _one(getattr(ec2, call)(Filters=in_vpc + user_filters(user, kind))[key], kind)

        subnet = find("private-subnet", "describe_subnets", "Subnets")()
        if subnet is None:
            az = _pick_az(ec2, availability_zone)
            subnet = ec2.create_subnet(VpcId=vpc_id, CidrBlock=str(blocks[0]), AvailabilityZone=az,
                                       TagSpecifications=tag_spec("subnet", user, "private-subnet"))["Subnet"]
            created.append(subnet["SubnetId"])
        az = subnet["AvailabilityZone"]
        if availability_zone and availability_zone != az:
            raise WorkshopError(f"Your workshop network is in {az}, not {availability_zone}.",
                                "run cleanup first to move it, or leave availability_zone unset.")

        route_table = _find_or_create(
            find("private-rt", "describe_route_tables", "RouteTables"),
            lambda: ec2.create_route_table(VpcId=vpc_id, TagSpecifications=tag_spec("route-table", user, "private-rt"))["RouteTable"],
            created, "RouteTableId",
        )
        rt_id = route_table["RouteTableId"]
        if not any(a.get("SubnetId") == subnet["SubnetId"] for a in route_table.get("Associations", [])):
            ec2.associate_route_table(RouteTableId=rt_id, SubnetId=subnet["SubnetId"])

        sg = find("security-group", "describe_security_groups", "SecurityGroups")()
        if sg is None:
            sg_id = ec2.create_security_group(
                GroupName=f"{aws.WORKSHOP_NAME}-{user}", VpcId=vpc_id,
                Description="distributed-training-workshop: all traffic between the hosts of a job, nothing else",
                TagSpecifications=tag_spec("security-group", user, "security-group"),
            )["GroupId"]
            created.append(sg_id)
            # Self-referencing: every member may reach every other member on every port (NCCL,
            # torchrun's rendezvous, MPI/SSH, EFA); no rule admits anything from outside.
            ec2.authorize_security_group_ingress(
                GroupId=sg_id, IpPermissions=[{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg_id}]}]
            )
        else:
            sg_id = sg["GroupId"]

        s3_endpoint = _find_or_create(
            find("s3-endpoint", "describe_vpc_endpoints", "VpcEndpoints"),
            lambda: ec2.create_vpc_endpoint(
                VpcEndpointType="Gateway", VpcId=vpc_id, ServiceName=f"com.amazonaws.{region}.s3",
                RouteTableIds=[rt_id], TagSpecifications=tag_spec("vpc-endpoint", user, "s3-endpoint"),
            )["VpcEndpoint"],
            created, "VpcEndpointId",
        )

        endpoint_ids: dict[str, str] = {}
        nat_id = None
        if egress == "endpoints":
            for service in (*INTERFACE_ENDPOINTS, *extra_endpoints):
                kind = f"endpoint-{service}"
                endpoint = _find_or_create(
                    find(kind, "describe_vpc_endpoints", "VpcEndpoints"),
                    lambda service=service, kind=kind: ec2.create_vpc_endpoint(
                        VpcEndpointType="Interface", VpcId=vpc_id, ServiceName=f"com.amazonaws.{region}.{service}",
                        SubnetIds=[subnet["SubnetId"]], SecurityGroupIds=[sg_id], PrivateDnsEnabled=True,
                        TagSpecifications=tag_spec("vpc-endpoint", user, kind),
                    )["VpcEndpoint"],
                    created, "VpcEndpointId",
                )
                endpoint_ids[service] = endpoint["VpcEndpointId"]
            poll(lambda: _endpoints_state(ec2, list(endpoint_ids.values())), "the interface endpoints", timeout_s, poll_s)
        else:
            nat_id = _ensure_nat(ec2, vpc_id, blocks[1], az, rt_id, user, created, find, timeout_s, poll_s)
    except (BotoCoreError, ClientError) as exc:
        note = f" (created before the failure: {', '.join(created)}; run cleanup to remove them)" if created else ""
        raise aws_error(f"Creating the workshop network failed{note}", exc) from None
    network = Network(
        region=region, vpc_id=vpc_id, cidr=vpc["CidrBlock"], availability_zone=az,
        subnet_ids=[subnet["SubnetId"]], security_group_id=sg_id, route_table_id=rt_id,
        s3_endpoint_id=s3_endpoint["VpcEndpointId"], egress=egress,
        interface_endpoint_ids=endpoint_ids, nat_gateway_id=nat_id, created=created,
    )
    return network


def _vpc_state(ec2: Any, vpc_id: str) -> tuple[bool, str]:
    state = ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"][0].get("State", "available")
    return state == "available", state


def _endpoints_state(ec2: Any, ids: list[str]) -> tuple[bool, str]:
    if not ids:
        return True, "none"
    endpoints = ec2.describe_vpc_endpoints(VpcEndpointIds=ids)["VpcEndpoints"]
    states = {e["VpcEndpointId"]: e.get("State", "available").lower() for e in endpoints}
    failed = {k: v for k, v in states.items() if v in ("failed", "rejected", "deleted")}
    if failed:
        raise WorkshopError(f"Interface endpoint(s) ended in state {failed}.",
                            "check that the region offers these services, then run cleanup and try again.")
    return all(v == "available" for v in states.values()), json.dumps(states)


def _ensure_nat(ec2, vpc_id, block, az, private_rt, user, created, find, timeout_s, poll_s) -> str:
    """Public subnet + internet gateway + NAT gateway (with an Elastic IP) in the same AZ."""
    public = _find_or_create(
        find("public-subnet", "describe_subnets", "Subnets"),
        lambda: ec2.create_subnet(VpcId=vpc_id, CidrBlock=str(block), AvailabilityZone=az,
                                  TagSpecifications=tag_spec("subnet", user, "public-subnet"))["Subnet"],
        created, "SubnetId",
    )
    igws = ec2.describe_internet_gateways(Filters=user_filters(user, "igw"))["InternetGateways"]
    igw = _one(igws, "internet gateway")
    if igw is None:
        igw = ec2.create_internet_gateway(TagSpecifications=tag_spec("internet-gateway", user, "igw"))["InternetGateway"]
        created.append(igw["InternetGatewayId"])
    if not any(a.get("VpcId") == vpc_id for a in igw.get("Attachments", [])):
        ec2.attach_internet_gateway(InternetGatewayId=igw["InternetGatewayId"], VpcId=vpc_id)
    public_rt = _find_or_create(
        find("public-rt", "describe_route_tables", "RouteTables"),
        lambda: ec2.create_route_table(VpcId=vpc_id, TagSpecifications=tag_spec("route-table", user, "public-rt"))["RouteTable"],
        created, "RouteTableId",
    )
    if not any(r.get("GatewayId") == igw["InternetGatewayId"] for r in public_rt.get("Routes", [])):
        ec2.create_route(RouteTableId=public_rt["RouteTableId"], DestinationCidrBlock="0.0.0.0/0",
                         GatewayId=igw["InternetGatewayId"])
    if not any(a.get("SubnetId") == public["SubnetId"] for a in public_rt.get("Associations", [])):
        ec2.associate_route_table(RouteTableId=public_rt["RouteTableId"], SubnetId=public["SubnetId"])
    nats = [n for n in ec2.describe_nat_gateways(Filters=in_vpc_filter(vpc_id) + user_filters(user, "nat"))["NatGateways"]
            if n["State"] not in ("deleted", "deleting", "failed")]
    nat = _one(nats, "NAT gateway")
    if nat is None:
        eip = _one(ec2.describe_addresses(Filters=user_filters(user, "nat-eip"))["Addresses"], "Elastic IP")
        if eip is None:
            eip = ec2.allocate_address(Domain="vpc", TagSpecifications=tag_spec("elastic-ip", user, "nat-eip"))
            created.append(eip["AllocationId"])
        nat = ec2.create_nat_gateway(SubnetId=public["SubnetId"], AllocationId=eip["AllocationId"],
                                     TagSpecifications=tag_spec("natgateway", user, "nat"))["NatGateway"]
        created.append(nat["NatGatewayId"])
    nat_id = nat["NatGatewayId"]

    def nat_state() -> tuple[bool, str]:
        gw = ec2.describe_nat_gateways(NatGatewayIds=[nat_id])["NatGateways"][0]
        if gw["State"] == "failed":
            raise WorkshopError(f"NAT gateway {nat_id} failed: {gw.get('FailureMessage', 'no reason given')}.",
                                "run cleanup, then try again (or use egress='endpoints').")
        return gw["State"] == "available", gw["State"]

    poll(nat_state, f"NAT gateway {nat_id}", timeout_s, poll_s)
    routes = ec2.describe_route_tables(RouteTableIds=[private_rt])["RouteTables"][0].get("Routes", [])
    if not any(r.get("NatGatewayId") == nat_id for r in routes):
        ec2.create_route(RouteTableId=private_rt, DestinationCidrBlock="0.0.0.0/0", NatGatewayId=nat_id)
    return nat_id


def in_vpc_filter(vpc_id: str) -> list[dict[str, Any]]:
    return [{"Name": "vpc-id", "Values": [vpc_id]}]


def find_network(session: Any = None, user: str | None = None) -> str | None:
    """This user's workshop VPC id, if there is one (read-only)."""
    boto = aws.as_boto_session(session)
    return (_find_vpc(boto.client("ec2"), user or aws.user_prefix()) or {}).get("VpcId")


def _retry_dependency(call: Callable[[], Any], what: str, timeout_s: float, poll_s: float) -> None:
    """Run a delete until AWS stops answering DependencyViolation (ENIs take a while to go)."""
    from botocore.exceptions import ClientError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            call()
            return
        except ClientError as exc:
            if code_of(exc).endswith(("NotFound", ".NotFound")) or "NotFound" in code_of(exc):
                return
            if code_of(exc) not in ("DependencyViolation", "InvalidIPAddress.InUse") or time.monotonic() >= deadline:
                raise aws_error(f"Deleting {what} failed", exc) from None
            time.sleep(poll_s)


def delete_network(session: Any = None, *, user: str | None = None, timeout_s: float = NETWORK_TIMEOUT_S,
                   poll_s: float = POLL_S, include_stack: bool = False) -> list[str]:
    """Delete every workshop network resource of this user, in dependency order; returns their ids.

    Safe to run twice: the second run finds nothing and returns []. A VPC an event's stack made
    (tagged `TAG_STACK`) is left to the stack and its organizer unless `include_stack`.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    boto = aws.as_boto_session(session)
    user = user or aws.user_prefix()
    ec2 = boto.client("ec2")
    deleted: list[str] = []
    try:
        vpcs = ec2.describe_vpcs(Filters=user_filters(user))["Vpcs"]
        for vpc in vpcs:
            stack = {t["Key"]: t["Value"] for t in vpc.get("Tags", [])}.get(TAG_STACK)
            if stack and not include_stack:
                say(f"network {vpc['VpcId']}: kept, made by the event's stack {stack} (the organizer's "
                    "`python -m workshop event cleanup` deletes it)")
                continue
            vpc_id = vpc["VpcId"]
            in_vpc = in_vpc_filter(vpc_id)
            endpoints = [e["VpcEndpointId"] for e in ec2.describe_vpc_endpoints(Filters=in_vpc)["VpcEndpoints"]
                         if e.get("State", "").lower() not in ("deleted", "deleting")]
            if endpoints:
                ec2.delete_vpc_endpoints(VpcEndpointIds=endpoints)
                deleted += endpoints
            nats = [n["NatGatewayId"] for n in ec2.describe_nat_gateways(Filters=in_vpc)["NatGateways"]
                    if n["State"] not in ("deleted", "deleting")]
            for nat_id in nats:
                ec2.delete_nat_gateway(NatGatewayId=nat_id)
                deleted.append(nat_id)
            if nats:
                poll(lambda nats=nats: _nats_gone(ec2, nats), "the NAT gateway to be deleted", timeout_s, poll_s)
            for igw in ec2.describe_internet_gateways(
                Filters=[{"Name": "attachment.vpc-id", "Values": [vpc_id]}]
            )["InternetGateways"]:
                ec2.detach_internet_gateway(InternetGatewayId=igw["InternetGatewayId"], VpcId=vpc_id)
                ec2.delete_internet_gateway(InternetGatewayId=igw["InternetGatewayId"])
                deleted.append(igw["InternetGatewayId"])
            for subnet in ec2.describe_subnets(Filters=in_vpc)["Subnets"]:
                _retry_dependency(lambda s=subnet["SubnetId"]: ec2.delete_subnet(SubnetId=s), subnet["SubnetId"], timeout_s, poll_s)
                deleted.append(subnet["SubnetId"])
            for rt in ec2.describe_route_tables(Filters=in_vpc)["RouteTables"]:
                if any(a.get("Main") for a in rt.get("Associations", [])):
                    continue  # the VPC's main table goes with the VPC
                for assoc in rt.get("Associations", []):
                    if assoc.get("RouteTableAssociationId"):
                        ec2.disassociate_route_table(AssociationId=assoc["RouteTableAssociationId"])
                ec2.delete_route_table(RouteTableId=rt["RouteTableId"])
                deleted.append(rt["RouteTableId"])
            for sg in ec2.describe_security_groups(Filters=in_vpc)["SecurityGroups"]:
                if sg["GroupName"] == "default":
                    continue
                _retry_dependency(lambda g=sg["GroupId"]: ec2.delete_security_group(GroupId=g), sg["GroupId"], timeout_s, poll_s)
                deleted.append(sg["GroupId"])
            _retry_dependency(lambda v=vpc_id: ec2.delete_vpc(VpcId=v), vpc_id, timeout_s, poll_s)
            deleted.append(vpc_id)
        for address in ec2.describe_addresses(Filters=user_filters(user))["Addresses"]:
            # The NAT gateway's address: free (and billable) once the gateway is deleted.
            _retry_dependency(lambda a=address["AllocationId"]: ec2.release_address(AllocationId=a),
                              address["AllocationId"], timeout_s, poll_s)
            deleted.append(address["AllocationId"])
    except (BotoCoreError, ClientError) as exc:
        raise aws_error(f"Deleting the workshop network failed (deleted so far: {deleted or 'nothing'})", exc) from None
    return deleted


def _nats_gone(ec2: Any, ids: list[str]) -> tuple[bool, str]:
    states = {n["NatGatewayId"]: n["State"] for n in ec2.describe_nat_gateways(NatGatewayIds=ids)["NatGateways"]}
    return all(s == "deleted" for s in states.values()), json.dumps(states)
