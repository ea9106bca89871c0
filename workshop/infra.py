"""The workshop's AWS side: network, role, preflight checks, cost, and cleanup.

Everything is plain boto3 (EC2, IAM, STS, Service Quotas, SageMaker, S3): no CloudFormation
stack to roll back, each resource found again by its tags, so every call is idempotent and
testable under moto (`tests/test_infra.py`).

- `ensure_network()` creates or reuses one VPC per user: one private subnet in ONE
  availability zone (the instances of a distributed job talk to each other every step;
  within one AZ that traffic is fast and free, across AZs it costs $0.01/GB each way and adds
  latency), a security group that admits all traffic from itself and nothing else (the hosts
  of a job, and the interface endpoints, are its only members), an S3 gateway endpoint on the
  subnet's route table (free), and a way out for what a job in that subnet needs:
  `egress="endpoints"` (default): interface endpoints for ECR (api, dkr), CloudWatch Logs and
  STS; `egress="nat"`: a NAT gateway in a public subnet of the same AZ (the only choice that
  reaches PyPI, e.g. for a `requirements.txt`). Their hourly prices are in `NETWORK_PRICES`.
- `ensure_role()` creates or reuses a SageMaker execution role with a least-privilege inline
  policy (`role_policy()`); `resolve_role()` falls back to it off SageMaker.
- `preflight()` runs before anything is created or uploaded: permission simulation for the
  caller, the Service Quotas value for the instance type, and the cost estimate
  (`estimate_cost()`, from `INSTANCE_PRICES`).
- `cleanup()` stops this user's running workshop jobs and deletes the network and the role
  the workshop created (and, opt-in, the user's S3 prefixes), reporting what it deleted.

Every resource is tagged `workshop=distributed-training-workshop` and
`workshop-user=<workshop.aws.user_prefix()>`, the same tags `workshop.sagemaker_jobs` puts
on jobs.
"""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workshop import aws
from workshop.errors import WorkshopError

TAG_WORKSHOP = "workshop"
TAG_USER = "workshop-user"
TAG_RESOURCE = "workshop-resource"  # which piece of the network: "vpc", "private-subnet", ...
DEFAULT_CIDR = "10.87.0.0/16"
EGRESS_CHOICES = ("endpoints", "nat")
# Interface endpoints a training job in a private subnet needs, by service suffix: image
# pulls (ECR API + Docker registry; the layers themselves come from S3 through the gateway
# endpoint), CloudWatch Logs, and STS (boto3 inside the container resolves regional STS).
# Add "sagemaker.api" through `extra_endpoints` if a script calls SageMaker itself.
INTERFACE_ENDPOINTS = ("ecr.api", "ecr.dkr", "logs", "sts")
POLL_S = 5.0
NETWORK_TIMEOUT_S = 600.0

# --------------------------------------------------------------------------- prices

PRICES_DATE = "2026-11-22"  # when these numbers were collected
PRICE_REGION = "us-east-1"  # on-demand list prices there; other regions differ


@dataclass(frozen=True)
class Price:
    usd_per_hour: float
    source: str
    verified: bool = False  # True only when read from an AWS pricing page itself


_SECONDARY = (
    "unverified: not read from aws.amazon.com/sagemaker/pricing (not reachable from here); "
    "the value published in public SageMaker cost tables, "
)
# SageMaker *training* on-demand prices, USD per instance-hour. Check
# https://aws.amazon.com/sagemaker/pricing/ (On-Demand, Training) before relying on them.
INSTANCE_PRICES: dict[str, Price] = {
    "ml.m5.xlarge": Price(0.23, _SECONDARY + "two tables agree (0.230)"),
    "ml.c5.xlarge": Price(0.204, _SECONDARY + "one table"),
    "ml.c5.2xlarge": Price(0.408, _SECONDARY + "one table"),
    "ml.g4dn.xlarge": Price(0.736, _SECONDARY + "two tables agree (0.736/0.7364)"),
    "ml.g5.xlarge": Price(1.408, _SECONDARY + "four tables agree (1.408/1.41)"),
    "ml.g5.2xlarge": Price(1.515, _SECONDARY + "three tables agree (1.515/1.52)"),
    "ml.g5.12xlarge": Price(7.09, _SECONDARY + "three tables agree"),
    "ml.p3.2xlarge": Price(3.825, _SECONDARY + "two tables agree (3.825/3.83)"),
    "ml.p4d.24xlarge": Price(37.688, _SECONDARY + "one table (37.69)"),
}
# Network pieces, USD per hour while they exist (whether or not a job runs).
NETWORK_PRICES: dict[str, Price] = {
    "interface_endpoint": Price(
        0.01,
        "per endpoint per AZ-hour, plus $0.01/GB processed: aws.amazon.com/privatelink/pricing "
        "(per-GB tier read there; the hourly rate from public cost guides, unverified)",
    ),
    "nat_gateway": Price(
        0.045,
        "per hour, plus $0.045/GB processed: aws.amazon.com/vpc/pricing as quoted by public "
        "cost guides (us-east-1), unverified",
    ),
    "public_ipv4": Price(0.005, "per public IPv4 address-hour (the NAT gateway's), public cost guides, unverified"),
    "s3_gateway_endpoint": Price(0.0, "gateway endpoints for S3 have no hourly or per-GB charge"),
}
# Measured SageMaker billable seconds per lab (none measured yet: no account here).
TYPICAL_RUN_S: dict[str, int] = {}


def network_hourly_usd(egress: str | None, extra_endpoints: Sequence[str] = ()) -> float:
    """What the workshop network costs per hour it exists (data processing not included)."""
    if not egress:
        return 0.0
    if egress == "nat":
        return NETWORK_PRICES["nat_gateway"].usd_per_hour + NETWORK_PRICES["public_ipv4"].usd_per_hour
    count = len(INTERFACE_ENDPOINTS) + len(extra_endpoints)
    return count * NETWORK_PRICES["interface_endpoint"].usd_per_hour


@dataclass(frozen=True)
class CostEstimate:
    instance_type: str
    instance_count: int
    max_run_s: int
    hourly_usd: float | None  # one instance
    upper_bound_usd: float | None  # instances x hourly x max_run
    typical_run_s: int | None
    typical_usd: float | None
    network_egress: str | None
    network_hourly_usd: float
    source: str

    def lines(self) -> list[str]:
        n, t = self.instance_count, self.instance_type
        hours = self.max_run_s / 3600
        if self.hourly_usd is None:
            out = [f"cost: no price on record for {t}; see https://aws.amazon.com/sagemaker/pricing/"]
        else:
            out = [
                f"cost: at most ${self.upper_bound_usd:,.2f} = {n} x {t} x ${self.hourly_usd:.3f}/h x "
                f"{hours:g} h (max_run; billing is per second, so a shorter job costs less)"
            ]
            if self.typical_usd is not None:
                out.append(f"cost: typically ${self.typical_usd:,.2f} ({self.typical_run_s} s billed)")
            else:
                out.append("cost: typical run time on SageMaker not measured yet; each minute costs "
                           f"${n * self.hourly_usd / 60:.3f}")
        if self.network_egress:
            out.append(
                f"cost: the workshop network ({self.network_egress}) adds ${self.network_hourly_usd:.3f} per hour "
                "it exists, job or not: run cleanup when done"
            )
        out.append(f"prices: {PRICE_REGION} on-demand, collected {PRICES_DATE}; {self.source}")
        return out


def estimate_cost(
    instance_type: str,
    instance_count: int,
    max_run_s: int,
    *,
    lab_key: str | None = None,
    network_egress: str | None = None,
) -> CostEstimate:
    """instances x hourly price x max_run hours: the most the job can cost."""
    price = INSTANCE_PRICES.get(instance_type)
    hourly = price.usd_per_hour if price else None
    typical_s = TYPICAL_RUN_S.get(lab_key or "")
    return CostEstimate(
        instance_type=instance_type,
        instance_count=instance_count,
        max_run_s=max_run_s,
        hourly_usd=hourly,
        upper_bound_usd=None if hourly is None else instance_count * hourly * max_run_s / 3600,
        typical_run_s=typical_s,
        typical_usd=None if hourly is None or typical_s is None else instance_count * hourly * typical_s / 3600,
        network_egress=network_egress,
        network_hourly_usd=network_hourly_usd(network_egress),
        source=price.source if price else "no price on record",
    )


# --------------------------------------------------------------------------- helpers


def _say(message: str) -> None:
    print(f"[infra] {message}", flush=True)


def workshop_tags(user: str | None = None, **extra: str) -> list[dict[str, str]]:
    tags = {TAG_WORKSHOP: aws.WORKSHOP_NAME, TAG_USER: user or aws.user_prefix(), **extra}
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def _tag_spec(resource_type: str, user: str, resource: str) -> list[dict[str, Any]]:
    name = f"{aws.WORKSHOP_NAME}-{user}-{resource}"
    return [{"ResourceType": resource_type, "Tags": workshop_tags(user, **{TAG_RESOURCE: resource, "Name": name})}]


def _user_filters(user: str, resource: str | None = None) -> list[dict[str, Any]]:
    filters = [
        {"Name": f"tag:{TAG_WORKSHOP}", "Values": [aws.WORKSHOP_NAME]},
        {"Name": f"tag:{TAG_USER}", "Values": [user]},
    ]
    if resource:
        filters.append({"Name": f"tag:{TAG_RESOURCE}", "Values": [resource]})
    return filters


def _code(exc: Exception) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Code", "")


def _aws_error(what: str, exc: Exception) -> WorkshopError:
    """A botocore error as a WorkshopError that names its fix."""
    code = _code(exc)
    if code in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
        return WorkshopError(
            f"{what}: permission denied ({exc}).",
            "ask your administrator to allow the action named in the message for this user or role "
            "(`python -m workshop run LAB --mode sagemaker --dry-run` lists what the workshop calls).",
        )
    if code.endswith("LimitExceeded"):
        return WorkshopError(f"{what}: an account limit was reached ({exc}).",
                             "delete unused resources of that kind, or request a higher limit in Service Quotas.")
    if code in ("ExpiredToken", "InvalidClientTokenId", "UnrecognizedClientException", "AuthFailure"):
        return WorkshopError(f"{what}: AWS rejected the credentials ({exc}).", aws.CREDENTIALS_FIX)
    return WorkshopError(f"{what}: {exc}", "see the message; nothing else was changed after this step.")


def _poll(check: Callable[[], tuple[bool, str]], what: str, timeout_s: float, poll_s: float = POLL_S) -> None:
    """Call `check` until it says done; raise a WorkshopError with its last state at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, state = check()
        if done:
            return
        if time.monotonic() >= deadline:
            raise WorkshopError(
                f"Timed out after {timeout_s:g} s waiting for {what} (last state: {state}).",
                "look at it in the AWS console; run the same call again to resume, or cleanup to remove it.",
            )
        time.sleep(poll_s)


# --------------------------------------------------------------------------- network


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
    return _one(ec2.describe_vpcs(Filters=_user_filters(user, "vpc"))["Vpcs"], "VPC")


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
            vpc = ec2.create_vpc(CidrBlock=str(net), TagSpecifications=_tag_spec("vpc", user, "vpc"))["Vpc"]
            created.append(vpc["VpcId"])
            _poll(lambda: _vpc_state(ec2, vpc["VpcId"]), f"VPC {vpc['VpcId']}", timeout_s, poll_s)
            # Private DNS names of interface endpoints need both.
            ec2.modify_vpc_attribute(VpcId=vpc["VpcId"], EnableDnsSupport={"Value": True})
            ec2.modify_vpc_attribute(VpcId=vpc["VpcId"], EnableDnsHostnames={"Value": True})
        vpc_id = vpc["VpcId"]
        blocks = list(ipaddress.ip_network(vpc["CidrBlock"]).subnets(new_prefix=min(28, ipaddress.ip_network(vpc["CidrBlock"]).prefixlen + 4)))
        in_vpc = [{"Name": "vpc-id", "Values": [vpc_id]}]

        def find(kind: str, call: str, key: str) -> Callable[[], dict[str, Any] | None]:
            return lambda: _one(getattr(ec2, call)(Filters=in_vpc + _user_filters(user, kind))[key], kind)

        subnet = find("private-subnet", "describe_subnets", "Subnets")()
        if subnet is None:
            az = _pick_az(ec2, availability_zone)
            subnet = ec2.create_subnet(VpcId=vpc_id, CidrBlock=str(blocks[0]), AvailabilityZone=az,
                                       TagSpecifications=_tag_spec("subnet", user, "private-subnet"))["Subnet"]
            created.append(subnet["SubnetId"])
        az = subnet["AvailabilityZone"]
        if availability_zone and availability_zone != az:
            raise WorkshopError(f"Your workshop network is in {az}, not {availability_zone}.",
                                "run cleanup first to move it, or leave availability_zone unset.")

        route_table = _find_or_create(
            find("private-rt", "describe_route_tables", "RouteTables"),
            lambda: ec2.create_route_table(VpcId=vpc_id, TagSpecifications=_tag_spec("route-table", user, "private-rt"))["RouteTable"],
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
                TagSpecifications=_tag_spec("security-group", user, "security-group"),
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
                RouteTableIds=[rt_id], TagSpecifications=_tag_spec("vpc-endpoint", user, "s3-endpoint"),
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
                        TagSpecifications=_tag_spec("vpc-endpoint", user, kind),
                    )["VpcEndpoint"],
                    created, "VpcEndpointId",
                )
                endpoint_ids[service] = endpoint["VpcEndpointId"]
            _poll(lambda: _endpoints_state(ec2, list(endpoint_ids.values())), "the interface endpoints", timeout_s, poll_s)
        else:
            nat_id = _ensure_nat(ec2, vpc_id, blocks[1], az, rt_id, user, created, find, timeout_s, poll_s)
    except (BotoCoreError, ClientError) as exc:
        note = f" (created before the failure: {', '.join(created)}; run cleanup to remove them)" if created else ""
        raise _aws_error(f"Creating the workshop network failed{note}", exc) from None
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
                                  TagSpecifications=_tag_spec("subnet", user, "public-subnet"))["Subnet"],
        created, "SubnetId",
    )
    igws = ec2.describe_internet_gateways(Filters=_user_filters(user, "igw"))["InternetGateways"]
    igw = _one(igws, "internet gateway")
    if igw is None:
        igw = ec2.create_internet_gateway(TagSpecifications=_tag_spec("internet-gateway", user, "igw"))["InternetGateway"]
        created.append(igw["InternetGatewayId"])
    if not any(a.get("VpcId") == vpc_id for a in igw.get("Attachments", [])):
        ec2.attach_internet_gateway(InternetGatewayId=igw["InternetGatewayId"], VpcId=vpc_id)
    public_rt = _find_or_create(
        find("public-rt", "describe_route_tables", "RouteTables"),
        lambda: ec2.create_route_table(VpcId=vpc_id, TagSpecifications=_tag_spec("route-table", user, "public-rt"))["RouteTable"],
        created, "RouteTableId",
    )
    if not any(r.get("GatewayId") == igw["InternetGatewayId"] for r in public_rt.get("Routes", [])):
        ec2.create_route(RouteTableId=public_rt["RouteTableId"], DestinationCidrBlock="0.0.0.0/0",
                         GatewayId=igw["InternetGatewayId"])
    if not any(a.get("SubnetId") == public["SubnetId"] for a in public_rt.get("Associations", [])):
        ec2.associate_route_table(RouteTableId=public_rt["RouteTableId"], SubnetId=public["SubnetId"])
    nats = [n for n in ec2.describe_nat_gateways(Filters=in_vpc_filter(vpc_id) + _user_filters(user, "nat"))["NatGateways"]
            if n["State"] not in ("deleted", "deleting", "failed")]
    nat = _one(nats, "NAT gateway")
    if nat is None:
        eip = _one(ec2.describe_addresses(Filters=_user_filters(user, "nat-eip"))["Addresses"], "Elastic IP")
        if eip is None:
            eip = ec2.allocate_address(Domain="vpc", TagSpecifications=_tag_spec("elastic-ip", user, "nat-eip"))
            created.append(eip["AllocationId"])
        nat = ec2.create_nat_gateway(SubnetId=public["SubnetId"], AllocationId=eip["AllocationId"],
                                     TagSpecifications=_tag_spec("natgateway", user, "nat"))["NatGateway"]
        created.append(nat["NatGatewayId"])
    nat_id = nat["NatGatewayId"]

    def nat_state() -> tuple[bool, str]:
        gw = ec2.describe_nat_gateways(NatGatewayIds=[nat_id])["NatGateways"][0]
        if gw["State"] == "failed":
            raise WorkshopError(f"NAT gateway {nat_id} failed: {gw.get('FailureMessage', 'no reason given')}.",
                                "run cleanup, then try again (or use egress='endpoints').")
        return gw["State"] == "available", gw["State"]

    _poll(nat_state, f"NAT gateway {nat_id}", timeout_s, poll_s)
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
            if _code(exc).endswith(("NotFound", ".NotFound")) or "NotFound" in _code(exc):
                return
            if _code(exc) not in ("DependencyViolation", "InvalidIPAddress.InUse") or time.monotonic() >= deadline:
                raise _aws_error(f"Deleting {what} failed", exc) from None
            time.sleep(poll_s)


def delete_network(session: Any = None, *, user: str | None = None, timeout_s: float = NETWORK_TIMEOUT_S,
                   poll_s: float = POLL_S) -> list[str]:
    """Delete every workshop network resource of this user, in dependency order; returns their ids.

    Safe to run twice: the second run finds nothing and returns [].
    """
    from botocore.exceptions import BotoCoreError, ClientError

    boto = aws.as_boto_session(session)
    user = user or aws.user_prefix()
    ec2 = boto.client("ec2")
    deleted: list[str] = []
    try:
        vpcs = ec2.describe_vpcs(Filters=_user_filters(user))["Vpcs"]
        for vpc in vpcs:
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
                _poll(lambda nats=nats: _nats_gone(ec2, nats), "the NAT gateway to be deleted", timeout_s, poll_s)
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
        for address in ec2.describe_addresses(Filters=_user_filters(user))["Addresses"]:
            # The NAT gateway's address: free (and billable) once the gateway is deleted.
            _retry_dependency(lambda a=address["AllocationId"]: ec2.release_address(AllocationId=a),
                              address["AllocationId"], timeout_s, poll_s)
            deleted.append(address["AllocationId"])
    except (BotoCoreError, ClientError) as exc:
        raise _aws_error(f"Deleting the workshop network failed (deleted so far: {deleted or 'nothing'})", exc) from None
    return deleted


def _nats_gone(ec2: Any, ids: list[str]) -> tuple[bool, str]:
    states = {n["NatGatewayId"]: n["State"] for n in ec2.describe_nat_gateways(NatGatewayIds=ids)["NatGateways"]}
    return all(s == "deleted" for s in states.values()), json.dumps(states)


# --------------------------------------------------------------------------- role


def role_name(user: str | None = None) -> str:
    """The workshop's execution role for this user (IAM role names: at most 64 characters)."""
    return f"{aws.WORKSHOP_NAME}-{user or aws.user_prefix()}"[:64]


def trust_policy() -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}
        ],
    }


def s3_prefixes(user: str | None = None, key_prefix: str | None = None) -> list[str]:
    """The S3 key prefixes the workshop writes for a user in the default bucket: the shared MNIST
    channels (`<workshop>/<user>/`) and each lab's jobs (SDK v3 keys code, drivers and outputs
    by the base job name, `<user>-<lab>/`), each after the SDK's default key prefix if the SDK
    config sets one (`key_prefix`; None: read it from the config, `aws.sdk_key_prefix()`)."""
    from workshop.labs import LABS

    user = user or aws.user_prefix()
    key_prefix = aws.sdk_key_prefix() if key_prefix is None else key_prefix
    labs = [aws.sanitize_name(f"{user}-{key}", 48) for key in LABS]
    return [aws.s3_key(key_prefix, aws.WORKSHOP_NAME, user) + "/", *(aws.s3_key(key_prefix, base) + "/" for base in labs)]


def role_policy(*, region: str, account: str, bucket: str, user: str | None = None,
                partition: str = "aws", key_prefix: str | None = None) -> dict[str, Any]:
    """Least privilege for a workshop training job. No `*` action anywhere; the few actions
    on `*` are those AWS defines no resource type for (ecr:GetAuthorizationToken,
    cloudwatch:PutMetricData, ec2:Describe*-style reads and the network-interface calls a VPC
    job's ENIs need), each named explicitly. S3: the user's prefixes (`s3_prefixes`, after
    `key_prefix`) in `bucket`, which must be where the SDK will put the job's files
    (`aws.sdk_bucket`, `aws.sdk_key_prefix`)."""
    user = user or aws.user_prefix()
    prefixes = s3_prefixes(user, key_prefix)
    bucket_arn = f"arn:{partition}:s3:::{bucket}"
    log_group = f"arn:{partition}:logs:{region}:{account}:log-group:/aws/sagemaker/TrainingJobs"
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "WorkshopObjects",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                "Resource": [f"{bucket_arn}/{p}*" for p in prefixes],
            },
            {
                "Sid": "WorkshopListing",
                "Effect": "Allow",
                "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
                "Resource": [bucket_arn],
                "Condition": {"StringLike": {"s3:prefix": [f"{p}*" for p in prefixes] + [""]}},
            },
            {
                "Sid": "PullTrainingImages",
                "Effect": "Allow",
                "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
                # The Deep Learning Container accounts differ by region (763104351884 in most).
                "Resource": [f"arn:{partition}:ecr:{region}:*:repository/*"],
            },
            {
                "Sid": "EcrToken",
                "Effect": "Allow",
                "Action": ["ecr:GetAuthorizationToken"],
                "Resource": "*",  # this action has no resource type
            },
            {
                "Sid": "TrainingLogs",
                "Effect": "Allow",
                "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                "Resource": [log_group, f"{log_group}:*"],
            },
            {
                "Sid": "TrainingMetrics",
                "Effect": "Allow",
                "Action": ["cloudwatch:PutMetricData"],
                # No resource type, and no condition: SDK v3 checks the role when a ModelTrainer
                # is built by simulating this action (iam:SimulatePrincipalPolicy) with no context
                # keys, and a statement conditioned on `cloudwatch:namespace` does not apply to
                # such a simulation, so the SDK would reject the role (RoleValidationError). The
                # SDK's own training role grants it the same way. One action, metrics only.
                "Resource": "*",
            },
            {
                "Sid": "VpcJobNetworkInterfaces",
                "Effect": "Allow",
                "Action": [
                    "ec2:CreateNetworkInterface", "ec2:CreateNetworkInterfacePermission",
                    "ec2:DeleteNetworkInterface", "ec2:DeleteNetworkInterfacePermission",
                    "ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs", "ec2:DescribeDhcpOptions",
                    "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups",
                ],
                "Resource": "*",  # the Describe calls have no resource type; creates name the VPC below
            },
        ],
    }


def shipped_policy_documents(region: str = "us-east-1", account: str = "123456789012",
                             bucket: str = "sagemaker-us-east-1-123456789012") -> dict[str, dict[str, Any]]:
    """Every IAM policy document this package writes, by name (for the wildcard check)."""
    return {
        "trust_policy": trust_policy(),
        "role_policy": role_policy(region=region, account=account, bucket=bucket, user="alice", key_prefix=""),
    }


def wildcard_violations(document: dict[str, Any]) -> list[str]:
    """Allow statements that grant `*` (or `service:*`, or NotAction) over `*` resources."""
    statements = document.get("Statement", [])
    statements = [statements] if isinstance(statements, dict) else statements
    bad = []
    for i, st in enumerate(statements):
        if st.get("Effect") != "Allow":
            continue
        as_list = lambda v: [v] if isinstance(v, str) else list(v or [])  # noqa: E731
        actions = as_list(st.get("Action"))
        resources = as_list(st.get("Resource")) or ["*"] * ("NotResource" in st)
        wide_action = "NotAction" in st or any(a == "*" or a.endswith(":*") for a in actions)
        if wide_action and ("*" in resources or "NotResource" in st):
            bad.append(f"statement {st.get('Sid', i)}: {actions or 'NotAction'} on {resources}")
    return bad


@dataclass
class RoleInfo:
    arn: str
    name: str
    created: bool


def _sdk_session(session: Any, boto: Any) -> Any:
    """`session` if it is a SageMaker `Session`, else one over `boto`: what says where the SDK
    puts a job's files (its default bucket and key prefix, from the user's SDK config)."""
    return session if hasattr(session, "default_bucket") else aws.sagemaker_session(boto)


def _account(boto: Any) -> tuple[str, str]:
    identity = boto.client("sts").get_caller_identity()
    return identity["Account"], identity["Arn"].split(":")[1]


def ensure_role(session: Any = None, *, user: str | None = None, bucket: str | None = None) -> RoleInfo:
    """Create or reuse this user's workshop execution role; its inline policy is (re)written
    each time, so it follows the code. Tagged like everything else, which is how cleanup knows
    it is the workshop's to delete. Its S3 access is to `bucket` (default: the bucket the SDK
    will use, `aws.sdk_bucket`) under the SDK's key prefix, if the SDK config sets one."""
    from botocore.exceptions import BotoCoreError, ClientError

    boto = aws.as_boto_session(session)
    sm_session = _sdk_session(session, boto)
    user = user or aws.user_prefix()
    name = role_name(user)
    iam = boto.client("iam")
    try:
        account, partition = _account(boto)
        bucket = bucket or aws.sdk_bucket(sm_session)
        created = False
        try:
            role = iam.get_role(RoleName=name)["Role"]
            tags = {t["Key"]: t["Value"] for t in iam.list_role_tags(RoleName=name).get("Tags", [])}
            if tags.get(TAG_WORKSHOP) != aws.WORKSHOP_NAME:
                raise WorkshopError(f"IAM role {name} exists but was not created by the workshop.",
                                    f"pass role='{role['Arn']}' to use it as is, or set WORKSHOP_USER to another name.")
        except ClientError as exc:
            if _code(exc) != "NoSuchEntity":
                raise
            role = iam.create_role(
                RoleName=name, AssumeRolePolicyDocument=json.dumps(trust_policy()),
                Description="distributed-training-workshop: SageMaker training jobs (least privilege)",
                Tags=workshop_tags(user), MaxSessionDuration=3600,
            )["Role"]
            created = True
        policy = role_policy(region=boto.region_name, account=account, bucket=bucket, user=user, partition=partition,
                             key_prefix=aws.sdk_key_prefix(sm_session))
        iam.put_role_policy(RoleName=name, PolicyName="workshop-training", PolicyDocument=json.dumps(policy))
    except (BotoCoreError, ClientError) as exc:
        raise _aws_error(f"Creating the IAM role {name} failed", exc) from None
    return RoleInfo(arn=role["Arn"], name=name, created=created)


def resolve_role(role: str | None = None, session: Any = None) -> str:
    """`workshop.aws.resolve_role`, then (off SageMaker, with no role given) this user's
    workshop role if it exists, instead of failing like the SDK's `get_execution_role()`."""
    try:
        return aws.resolve_role(role, session)
    except WorkshopError as exc:
        if role or not exc.message.startswith("No IAM role"):
            raise
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            arn = aws.as_boto_session(session).client("iam").get_role(RoleName=role_name())["Role"]["Arn"]
        except (BotoCoreError, ClientError):
            raise WorkshopError(
                exc.message,
                f"{exc.fix} Or create the workshop's least-privilege role: `python -m workshop role` "
                "(workshop.infra.ensure_role()), which is then found by name.",
            ) from None
        _say(f"using the workshop role {arn} (no role given, not on SageMaker)")
        return arn


def delete_role(session: Any = None, *, user: str | None = None) -> list[str]:
    """Delete this user's workshop role if the workshop created it (tagged); [] otherwise."""
    from botocore.exceptions import BotoCoreError, ClientError

    iam = aws.as_boto_session(session).client("iam")
    name = role_name(user)
    try:
        try:
            tags = {t["Key"]: t["Value"] for t in iam.list_role_tags(RoleName=name).get("Tags", [])}
        except ClientError as exc:
            if _code(exc) == "NoSuchEntity":
                return []
            raise
        if tags.get(TAG_WORKSHOP) != aws.WORKSHOP_NAME:
            return []
        for policy in iam.list_role_policies(RoleName=name)["PolicyNames"]:
            iam.delete_role_policy(RoleName=name, PolicyName=policy)
        for attached in iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]:
            iam.detach_role_policy(RoleName=name, PolicyArn=attached["PolicyArn"])
        iam.delete_role(RoleName=name)
    except (BotoCoreError, ClientError) as exc:
        raise _aws_error(f"Deleting the IAM role {name} failed", exc) from None
    return [name]


# --------------------------------------------------------------------------- preflight

# What the caller needs to run a job (the job's own needs are the role's policy), simulated
# against the resources the job really uses: a policy scoped to, say, the SageMaker bucket
# would show as a false "implicitDeny" if simulated against "*".
NETWORK_ACTIONS = (
    "ec2:CreateVpc", "ec2:CreateSubnet", "ec2:CreateSecurityGroup", "ec2:AuthorizeSecurityGroupIngress",
    "ec2:CreateRouteTable", "ec2:CreateVpcEndpoint", "ec2:CreateTags", "ec2:DescribeVpcs",
)
NAT_ACTIONS = ("ec2:CreateNatGateway", "ec2:AllocateAddress", "ec2:CreateInternetGateway", "ec2:CreateRoute")
ROLE_ACTIONS = ("iam:CreateRole", "iam:PutRolePolicy", "iam:TagRole", "iam:GetRole")
# What IAM sees when CreateTrainingJob passes the role. Administrators (and the SDK's own
# policies) allow iam:PassRole only under this condition, which a simulation without the key
# would not apply: the caller would be told, wrongly, that PassRole is missing.
PASS_ROLE_CONTEXT = [
    {"ContextKeyName": "iam:PassedToService", "ContextKeyValues": ["sagemaker.amazonaws.com"], "ContextKeyType": "string"}
]


def job_permission_checks(
    *, region: str, account: str, partition: str, base_job_name: str, user: str | None = None,
    bucket: str | None = None, key_prefix: str = "",
) -> list[tuple[tuple[str, ...], str | None]]:
    """(actions, resource ARN) groups a caller needs to start and follow a workshop job, in the
    bucket and under the key prefix the SDK will use (default: `sagemaker-<region>-<account>`,
    no prefix; `preflight` passes the SDK session's)."""
    bucket = bucket or f"sagemaker-{region}-{account}"
    data_prefix = aws.s3_key(key_prefix, aws.WORKSHOP_NAME, user or aws.user_prefix(), "data")
    logs = f"arn:{partition}:logs:{region}:{account}:log-group:/aws/sagemaker/TrainingJobs:log-stream:{base_job_name}-x"
    return [
        (("sagemaker:CreateTrainingJob", "sagemaker:DescribeTrainingJob", "sagemaker:AddTags"),
         f"arn:{partition}:sagemaker:{region}:{account}:training-job/{base_job_name}-x"),
        (("s3:PutObject", "s3:GetObject"), f"arn:{partition}:s3:::{bucket}/{data_prefix}/x"),
        (("s3:ListBucket",), f"arn:{partition}:s3:::{bucket}"),
        (("logs:GetLogEvents",), logs),
    ]


def _principal(iam: Any, caller_arn: str) -> str | None:
    """The IAM principal to simulate for the caller's STS identity (None: cannot simulate)."""
    parts = caller_arn.split(":", 5)
    if len(parts) < 6:
        return None
    partition, service, account, resource = parts[1], parts[2], parts[4], parts[5]
    if service == "iam" and resource.startswith("user/"):
        return caller_arn
    if service == "sts" and resource.startswith("assumed-role/"):
        name = resource.split("/")[1]
        try:
            return iam.get_role(RoleName=name)["Role"]["Arn"]  # with its path
        except Exception:  # noqa: BLE001 - no iam:GetRole: the path-less ARN is the best guess
            return f"arn:{partition}:iam::{account}:role/{name}"
    return None  # root, federated users: nothing to simulate


def check_permissions(iam: Any, caller_arn: str, role_arn: str,
                      checks: Sequence[tuple[Sequence[str], str | None]]) -> str:
    """Simulate the caller's policies for each (actions, resource ARN or None for "*") group,
    and iam:PassRole on `role_arn`.

    Raises a WorkshopError listing every denied action; returns a one-line status otherwise,
    also when the simulation itself is not possible (no permission to simulate, a fake AWS).
    """
    from botocore.exceptions import BotoCoreError, ClientError

    principal = _principal(iam, caller_arn)
    if principal is None:
        return f"permissions: not simulated for {caller_arn} (root or federated identity)"
    groups = [*checks, (("iam:PassRole",), role_arn)]
    denied: list[str] = []
    try:
        for names, resource in groups:
            kwargs: dict[str, Any] = {"PolicySourceArn": principal, "ActionNames": list(names)}
            if resource:
                kwargs["ResourceArns"] = [resource]
            if "iam:PassRole" in names:
                kwargs["ContextEntries"] = PASS_ROLE_CONTEXT
            for page in iam.get_paginator("simulate_principal_policy").paginate(**kwargs):
                denied += [r["EvalActionName"] for r in page["EvaluationResults"] if r["EvalDecision"] != "allowed"]
    except NotImplementedError:  # moto in-process
        return "permissions: not simulated (iam:SimulatePrincipalPolicy is not available here)"
    except ClientError as exc:
        return f"permissions: not simulated ({_code(exc) or exc}: you may lack iam:SimulatePrincipalPolicy)"
    except BotoCoreError as exc:
        return f"permissions: not simulated ({exc})"
    if denied:
        raise WorkshopError(
            f"{principal} is missing permissions the job needs: {', '.join(sorted(set(denied)))}.",
            "ask your administrator to allow these actions (iam:PassRole on "
            f"{role_arn}), or run on a SageMaker notebook instance whose role has them.",
        )
    count = sum(len(names) for names, _ in groups)
    return f"permissions: {principal} may pass the role and create the job ({count} actions simulated)"


def _training_quotas(sq: Any) -> dict[str, tuple[float, str]]:
    """Service Quotas of SageMaker: '<type> for training job usage' -> (value, quota code)."""
    out: dict[str, tuple[float, str]] = {}
    for page in sq.get_paginator("list_service_quotas").paginate(ServiceCode="sagemaker"):
        for quota in page["Quotas"]:
            name = quota.get("QuotaName", "")
            if name.endswith(" for training job usage"):
                out[name.split(" ")[0]] = (quota.get("Value", 0.0), quota.get("QuotaCode", ""))
    return out


def _cheaper_with_quota(
    quotas: dict[str, tuple[float, str]], instance_type: str, count: int,
    allowed: Callable[[str], bool] | None = None,
) -> list[str]:
    """Up to 3 other types whose quota allows `count`, cheapest first: GPU or CPU like
    `instance_type`, and, given `allowed` (the job plan's `allows`), only types the job's route
    and image can use (e.g. SMP: p4d/p4de/p5 only; a CUDA 13 image: no p3)."""
    gpu = instance_type.split(".")[1][:1] in ("g", "p")
    ok = [t for t, (v, _) in quotas.items() if v >= count and t != instance_type
          and (t.split(".")[1][:1] in ("g", "p")) == gpu and (allowed is None or allowed(t))]
    return sorted(ok, key=lambda t: (INSTANCE_PRICES[t].usd_per_hour if t in INSTANCE_PRICES else 1e9, t))[:3]


def check_quota(sq: Any, instance_type: str, count: int, region: str,
                allowed: Callable[[str], bool] | None = None) -> str:
    """The account's Service Quotas value for `instance_type` training instances.

    `allowed` (the job plan's `allows`): what an alternative instance type must satisfy, so a
    refusal never suggests a type the job's route or image cannot use."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        quotas = _training_quotas(sq)
    except NotImplementedError:
        return "quota: not checked (Service Quotas is not available here)"
    except ClientError as exc:
        return f"quota: not checked ({_code(exc) or exc}: you may lack servicequotas:ListServiceQuotas)"
    except BotoCoreError as exc:
        return f"quota: not checked ({exc})"
    if not quotas:
        return "quota: not checked (Service Quotas listed no SageMaker training quotas)"
    if instance_type not in quotas:
        offered = _cheaper_with_quota(quotas, instance_type, 1, allowed) or sorted(
            t for t in quotas if allowed is None or allowed(t))[:3]
        raise WorkshopError(
            f"{instance_type} is not offered for SageMaker training in {region} (no training quota for it).",
            f"choose another instance type, e.g. {', '.join(offered)}, or another region.",
        )
    value, code = quotas[instance_type]
    if value >= count:
        return f"quota: {instance_type} for training: {value:g} (need {count})"
    smaller = _cheaper_with_quota(quotas, instance_type, count, allowed)
    alternatives = f" or use {', '.join(smaller)}, whose quota allows {count}" if smaller else ""
    what = "is zero" if value == 0 else f"is {value:g}"
    raise WorkshopError(
        f"Your account's quota for {instance_type} training instances in {region} {what}; the job needs {count}.",
        f"request an increase: aws service-quotas request-service-quota-increase --service-code sagemaker "
        f"--quota-code {code} --desired-value {count} --region {region}{alternatives}"
        + ("" if value == 0 else f", or run with hosts={int(value)}") + ".",
    )


@dataclass
class PreflightReport:
    identity: str | None
    role_arn: str
    permissions: str
    quota: str
    cost: CostEstimate

    def lines(self) -> list[str]:
        return [f"role: {self.role_arn}", self.permissions, self.quota, *self.cost.lines()]


def preflight(
    plan: Any,
    role_arn: str,
    session: Any = None,
    *,
    identity: str | None = None,
    network_egress: str | None = None,
    creating_role: bool = False,
    show: bool = True,
) -> PreflightReport:
    """Permissions, quota and cost, before anything is created or uploaded.

    `plan` is a `workshop.sagemaker_jobs.JobPlan`. Raises WorkshopError for missing
    permissions, a too-small quota and an instance type the region lacks.
    """
    boto = aws.as_boto_session(session)
    identity = identity or aws.require_credentials(boto)
    partition, account = identity.split(":")[1], identity.split(":")[4]
    sm_session = _sdk_session(session, boto)  # where the SDK will put the job's files
    checks = job_permission_checks(region=boto.region_name, account=account, partition=partition,
                                   base_job_name=plan.base_job_name, bucket=aws.sdk_bucket(sm_session),
                                   key_prefix=aws.sdk_key_prefix(sm_session))
    if network_egress:
        checks.append((NETWORK_ACTIONS + (NAT_ACTIONS if network_egress == "nat" else ()), None))
    if creating_role:
        checks.append((ROLE_ACTIONS, f"arn:{partition}:iam::{account}:role/{role_name()}"))
    report = PreflightReport(
        identity=identity,
        role_arn=role_arn,
        permissions=check_permissions(boto.client("iam"), identity, role_arn, checks),
        quota=check_quota(boto.client("service-quotas"), plan.instance_type, plan.instance_count, boto.region_name,
                          allowed=getattr(plan, "allows", None)),
        cost=estimate_cost(plan.instance_type, plan.instance_count, plan.max_run_s, lab_key=plan.lab.key,
                           network_egress=network_egress),
    )
    if show:
        for line in report.lines():
            _say(line)
    return report


def dry_run_lines(plan: Any, role_arn: str, network_egress: str | None) -> list[str]:
    """What a dry run can say without an account: the network and role it would use, the cost,
    and which checks need credentials."""
    if network_egress:
        out = [
            f"network: would create or reuse VPC {DEFAULT_CIDR} tagged {TAG_USER}={aws.user_prefix()}: one private "
            f"subnet in one AZ, a self-only security group, an S3 gateway endpoint, "
            + ("a NAT gateway" if network_egress == "nat" else "interface endpoints " + ", ".join(INTERFACE_ENDPOINTS))
            + f" (${network_hourly_usd(network_egress):.3f}/h while it exists); placeholder ids below",
        ]
    else:
        out = ["network: none (SageMaker's own network; pass network=True for the workshop VPC)"]
    out.append(f"role: {role_arn}")
    out += estimate_cost(plan.instance_type, plan.instance_count, plan.max_run_s, lab_key=plan.lab.key,
                         network_egress=network_egress).lines()
    out.append("preflight needing an account (skipped in a dry run): credentials (sts:GetCallerIdentity), "
               "the role (iam:GetRole), permissions (iam:SimulatePrincipalPolicy), "
               f"the {plan.instance_type} quota (Service Quotas)")
    return out


# --------------------------------------------------------------------------- cleanup


def stop_user_jobs(sm: Any, user: str) -> list[str]:
    """Stop this user's InProgress workshop training jobs (by their tags); returns their names."""
    stopped = []
    for page in sm.get_paginator("list_training_jobs").paginate(StatusEquals="InProgress", NameContains=user):
        for job in page["TrainingJobSummaries"]:
            tags = {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=job["TrainingJobArn"]).get("Tags", [])}
            if tags.get(TAG_WORKSHOP) == aws.WORKSHOP_NAME and tags.get(TAG_USER) == user:
                sm.stop_training_job(TrainingJobName=job["TrainingJobName"])
                stopped.append(job["TrainingJobName"])
    return stopped


def delete_s3_prefixes(s3: Any, bucket: str, prefixes: Sequence[str]) -> int:
    """Delete every object under `prefixes` in `bucket`; returns how many."""
    count = 0
    for prefix in prefixes:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
                count += len(keys)
    return count


@dataclass
class CleanupReport:
    stopped_jobs: list[str] = field(default_factory=list)
    network: list[str] = field(default_factory=list)
    role: list[str] = field(default_factory=list)
    s3_objects: int | None = None  # None: S3 was left alone

    @property
    def nothing(self) -> bool:
        return not (self.stopped_jobs or self.network or self.role or self.s3_objects)

    def lines(self) -> list[str]:
        return [
            f"stopped jobs: {', '.join(self.stopped_jobs) or 'none running'}",
            f"network deleted: {', '.join(self.network) or 'none found'}",
            f"role deleted: {', '.join(self.role) or 'none created by the workshop'}",
            "S3: left as is (pass delete_s3=True / --delete-s3 to delete your workshop prefixes)"
            if self.s3_objects is None else f"S3: deleted {self.s3_objects} object(s)",
        ]


def cleanup(session: Any = None, *, delete_s3: bool = False, user: str | None = None,
            timeout_s: float = NETWORK_TIMEOUT_S, poll_s: float = POLL_S, show: bool = True) -> CleanupReport:
    """Stop this user's running workshop jobs, delete the network and the role the workshop
    created, and (opt-in) the user's S3 prefixes. Running it twice is harmless."""
    from botocore.exceptions import BotoCoreError, ClientError

    boto = aws.as_boto_session(session)
    aws.require_credentials(boto)
    user = user or aws.user_prefix()
    report = CleanupReport()
    try:
        report.stopped_jobs = stop_user_jobs(boto.client("sagemaker"), user)
    except NotImplementedError:  # a fake AWS without StopTrainingJob
        _say("could not stop jobs here (StopTrainingJob not available)")
    except (BotoCoreError, ClientError) as exc:
        raise _aws_error("Stopping your training jobs failed", exc) from None
    report.network = delete_network(boto, user=user, timeout_s=timeout_s, poll_s=poll_s)
    report.role = delete_role(boto, user=user)
    if delete_s3:
        s3 = boto.client("s3")
        sm_session = _sdk_session(session, boto)  # the SDK's bucket and key prefix, as the jobs used them
        bucket = aws.sdk_bucket(sm_session)
        try:
            s3.head_bucket(Bucket=bucket)
            report.s3_objects = delete_s3_prefixes(s3, bucket, s3_prefixes(user, aws.sdk_key_prefix(sm_session)))
        except ClientError as exc:
            if _code(exc) not in ("404", "NoSuchBucket", "NotFound"):
                raise _aws_error(f"Deleting your objects in {bucket} failed", exc) from None
            report.s3_objects = 0
    if show:
        for line in report.lines():
            _say(line)
    return report
