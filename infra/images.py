"""The NVRx job's image built in the account during `cdk deploy '<env>/Images'`, so no user needs Docker.

    ECR repository <cluster>/nvrx-train   immutable tags, scan on push, lifecycle rules; emptied and deleted with
                                          the stack (below)
    S3 asset                              the build context, images/nvrx
    CodeBuild project                     privileged Docker build: log in to the base's registry and to the
                                          repository, `docker build --build-arg BASE=<lock's nvrx-train>`, push
                                          the tag context_tag() (infra/spec/images.py)
    Custom::NvrxImageBuild                Provider framework over infra/functions/image_build.py: starts the build
                                          when the tag is not in the repository, waits for it, fails the deploy
                                          with the build's logs link

Removal: the repository is RemovalPolicy.DESTROY with EmptyOnDelete (AWS::ECR::Repository EmptyOnDelete: "If true,
deleting the repository force deletes the contents of the repository"; aws-cdk-lib aws-ecr `emptyOnDelete`, which
replaced the autoDeleteImages custom resource). Its name is fixed (trainctl pin and the lock name it), so a retained
repository would make the next create of the stack fail with "already exists": after `cdk destroy`, and after a
failed first deploy, whose rollback deletes what it created. Nothing is lost that the stack cannot rebuild: the
image is a function of images/nvrx and the lock's base. Nodes keep the images they pulled; a pod started after a
destroy cannot pull until the stack is deployed again.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import ArnFormat, CustomResource, Duration, RemovalPolicy, Stack
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import custom_resources as cr
from constructs import Construct

from infra.library_roles import Statements, rewrite_policy_statements
from infra.spec import Environment
from infra.spec.images import (
    BUILD_COMPUTE_TYPE,
    BUILD_POLL_SECONDS,
    BUILD_QUEUED_TIMEOUT_MINUTES,
    BUILD_TIMEOUT_MINUTES,
    CUSTOM_RESOURCE_TIMEOUT_MINUTES,
    KEEP_IMAGES,
    NVRX_CONTEXT,
    UNTAGGED_EXPIRE_DAYS,
    WAIT_TIMEOUT_MINUTES,
    BaseRegistry,
    RegistryKind,
    base_registry,
    context_tag,
    repository_name,
)
from infra.trust import confine_library_trust, source_conditions
from k8s.built_images import build_base

FUNCTIONS = Path(__file__).resolve().parent / "functions"
LOG_RETENTION = logs.RetentionDays.ONE_MONTH


# The build context's resolver (images/nvrx/resolve_base.sh): BASE (the lock's tag, @digest when pinned) -> the
# digest the tag names where the build runs, or a refusal when the tag no longer names the pinned digest.
RESOLVE_BASE = "resolve_base.sh"
# OCI image-spec annotations for the image a build is based on (its reference and digest), set as image labels.
BASE_NAME_LABEL = "org.opencontainers.image.base.name"
BASE_DIGEST_LABEL = "org.opencontainers.image.base.digest"


def buildspec(base: BaseRegistry) -> dict[str, object]:
    """Version 0.2: the commands share one shell, so FROM_DIGEST set in pre_build is there in build; a failed command
    fails its phase, and after a failed pre_build no build runs (CodeBuild User Guide, build spec reference)."""
    return {
        "version": "0.2",
        "phases": {
            "pre_build": {
                "commands": [
                    "BUILD_START=$(date +%s)",
                    base.login_command(),
                    "aws ecr get-login-password --region $AWS_REGION | "
                    'docker login --username AWS --password-stdin "$REGISTRY"',
                    f'FROM_DIGEST=$(sh {RESOLVE_BASE} "$BASE")',
                ]
            },
            # The push is in the build phase: post_build runs after a failed build too.
            "build": {
                "commands": [
                    'echo "building $IMAGE FROM $FROM_DIGEST (the lock: $BASE)"',
                    'docker build --build-arg "BASE=$FROM_DIGEST" '
                    f'--label "{BASE_NAME_LABEL}=${{BASE%@*}}" --label "{BASE_DIGEST_LABEL}=${{FROM_DIGEST##*@}}" '
                    '--tag "$IMAGE" .',
                    'docker push "$IMAGE"',
                    # What the build took against its limit (BUILD_TIMEOUT_MINUTES, an estimate until measured).
                    f'echo "pull, build and push took $(( ($(date +%s) - BUILD_START) / 60 )) min of the '
                    f'{BUILD_TIMEOUT_MINUTES}-min limit"',
                ]
            },
        },
    }


# aws-cdk-lib 2.275.0 (custom-resources/lib/provider-framework/waiter-state-machine.js) grants the waiter's role the
# CloudWatch Logs delivery actions and, beside them, logs:CreateLogStream and logs:PutLogEvents, all on "*": the last
# two let it write into any log group of the account. Step Functions delivers the logs itself; the role needs the
# delivery actions alone (Step Functions developer guide, "IAM policies for logging to CloudWatch Logs"), which is
# all aws-cdk-lib's own StateMachine grants.
WAITER_LOG_WRITES = ("logs:CreateLogStream", "logs:PutLogEvents")


def project_name(cluster_name: str) -> str:
    """The CodeBuild project's name, fixed so that its role's trust can name the project's ARN."""
    return f"{cluster_name}-nvrx-image"


def keep_waiter_to_log_delivery(provider: cr.Provider) -> None:
    where = "custom_resources.Provider waiter-state-machine/Role/DefaultPolicy"
    waiter = provider.node.try_find_child("waiter-state-machine")
    role = waiter.node.try_find_child("Role") if waiter is not None else None

    def without_log_writes(statements: Statements) -> Statements:
        logging = [s for s in statements if s["Resource"] == "*"]
        if len(logging) != 1 or not set(WAITER_LOG_WRITES) <= set(logging[0]["Action"]):
            raise LookupError(f"{where} no longer grants {WAITER_LOG_WRITES} on '*': aws-cdk-lib changed it")
        kept = [a for a in logging[0]["Action"] if a not in WAITER_LOG_WRITES]
        return [{**s, "Action": kept} if s is logging[0] else s for s in statements]

    rewrite_policy_statements(role.node.try_find_child("DefaultPolicy") if role else None, without_log_writes, where)


def registry_host(stack: Stack) -> str:
    """The environment's own registry, which the build logs in to before it pushes."""
    return f"{stack.account}.dkr.ecr.{stack.region}.{stack.url_suffix}"


class NvrxImageBuild(Construct):
    def __init__(
        self, scope: Construct, construct_id: str, *, environment: Environment, base: str | None = None
    ) -> None:
        super().__init__(scope, construct_id)
        base = base or build_base()  # the lock's nvrx-train, @digest when pinned
        registry, tag = base_registry(base), context_tag()
        self.tag = tag
        self.repository = ecr.Repository(
            self,
            "Repository",
            repository_name=repository_name(environment.cluster.name),
            image_tag_mutability=ecr.TagMutability.IMMUTABLE,
            image_scan_on_push=True,
            removal_policy=RemovalPolicy.DESTROY,
            empty_on_delete=True,
            lifecycle_rules=[
                ecr.LifecycleRule(
                    rule_priority=1,
                    description="leftovers of an interrupted push (tags are immutable)",
                    tag_status=ecr.TagStatus.UNTAGGED,
                    max_image_age=Duration.days(UNTAGGED_EXPIRE_DAYS),
                ),
                ecr.LifecycleRule(
                    rule_priority=2,
                    description=f"the {KEEP_IMAGES} most recent builds (one per Dockerfile change)",
                    tag_status=ecr.TagStatus.ANY,
                    max_image_count=KEEP_IMAGES,
                ),
            ],
        )
        context = s3_assets.Asset(self, "Context", path=str(NVRX_CONTEXT))
        stack = Stack.of(self)
        self.project = codebuild.Project(
            self,
            "Project",
            project_name=project_name(environment.cluster.name),
            description=f"images/nvrx/Dockerfile -> {repository_name(environment.cluster.name)}:{tag}",
            source=codebuild.Source.s3(bucket=context.bucket, path=context.s3_object_key),
            environment=codebuild.BuildEnvironment(
                build_image=codebuild.LinuxBuildImage.STANDARD_7_0,
                compute_type=codebuild.ComputeType[BUILD_COMPUTE_TYPE.removeprefix("BUILD_GENERAL1_")],
                privileged=True,  # docker build needs the Docker daemon
            ),
            environment_variables={
                "BASE": codebuild.BuildEnvironmentVariable(value=base),
                "IMAGE": codebuild.BuildEnvironmentVariable(value=self.repository.repository_uri_for_tag(tag)),
                "REGISTRY": codebuild.BuildEnvironmentVariable(value=registry_host(Stack.of(self))),
            },
            build_spec=codebuild.BuildSpec.from_object(buildspec(registry)),
            timeout=Duration.minutes(BUILD_TIMEOUT_MINUTES),
            queued_timeout=Duration.minutes(BUILD_QUEUED_TIMEOUT_MINUTES),
            concurrent_build_limit=1,
            logging=codebuild.LoggingOptions(
                cloud_watch=codebuild.CloudWatchLoggingOptions(log_group=self._log_group("BuildLogs"))
            ),
        )
        # The role is this project's (CodeBuild User Guide, "Allow CodeBuild to interact with other AWS services":
        # aws:SourceAccount, and aws:SourceArn the project's ARN; its builds' ARNs, build/<project>:<id>, are listed
        # beside it, the project's as well).
        project_arn = stack.format_arn(
            service="codebuild", resource="project", resource_name=project_name(environment.cluster.name)
        )
        builds_arn = stack.format_arn(
            service="codebuild", resource="build", resource_name=f"{project_name(environment.cluster.name)}:*"
        )
        confine_library_trust(
            self.project.role,
            "codebuild.amazonaws.com",
            source_conditions(self, [project_arn, builds_arn]),
            "aws_codebuild.Project Role",
        )
        self.repository.grant_pull_push(self.project)
        self._grant_base_pull(registry)

        code = lambda_.Code.from_asset(str(FUNCTIONS), exclude=["__pycache__", "*.pyc", "__init__.py"])
        on_event = self._function("OnEvent", code, "image_build.on_event")
        is_complete = self._function("IsComplete", code, "image_build.is_complete")
        for function, action in ((on_event, "codebuild:StartBuild"), (is_complete, "codebuild:BatchGetBuilds")):
            function.add_to_role_policy(iam.PolicyStatement(actions=[action], resources=[self.project.project_arn]))
            self.repository.grant(function, "ecr:DescribeImages")
        provider = cr.Provider(
            self,
            "Provider",
            on_event_handler=on_event,
            is_complete_handler=is_complete,
            query_interval=Duration.seconds(BUILD_POLL_SECONDS),
            total_timeout=Duration.minutes(WAIT_TIMEOUT_MINUTES),
            log_group=self._log_group("ProviderLogs"),
            disable_waiter_state_machine_logging=False,
            waiter_state_machine_log_options=cr.LogOptions(
                # Every state transition, without the event (it carries CloudFormation's presigned response URL).
                destination=self._log_group("WaiterLogs"),
                level=sfn.LogLevel.ALL,
                include_execution_data=False,
            ),
        )
        keep_waiter_to_log_delivery(provider)
        # The waiter's role is this account's state machines' (Step Functions Developer Guide, "Creating an IAM role
        # for your state machine": the waiter's name is CloudFormation's, hence stateMachine:*).
        waiter = provider.node.try_find_child("waiter-state-machine")
        confine_library_trust(
            waiter.node.try_find_child("Role") if waiter is not None else None,
            "states.amazonaws.com",
            source_conditions(
                self,
                [
                    stack.format_arn(
                        service="states",
                        resource="stateMachine",
                        resource_name="*",
                        arn_format=ArnFormat.COLON_RESOURCE_NAME,
                    )
                ],
            ),
            "custom_resources.Provider waiter-state-machine/Role",
        )
        self.build = CustomResource(
            self,
            "Build",
            service_token=provider.service_token,
            resource_type="Custom::NvrxImageBuild",
            service_timeout=Duration.minutes(CUSTOM_RESOURCE_TIMEOUT_MINUTES),
            properties={
                "ProjectName": self.project.project_name,
                "RepositoryName": self.repository.repository_name,
                "ImageTag": tag,
                "Base": base,
            },
        )
        self.image_uri = self.repository.repository_uri_for_tag(tag)
        self.digest = self.build.get_att_string("ImageDigest")

    def _log_group(self, construct_id: str) -> logs.LogGroup:
        return logs.LogGroup(self, construct_id, retention=LOG_RETENTION, removal_policy=RemovalPolicy.DESTROY)

    def _function(self, construct_id: str, code: lambda_.Code, handler: str) -> lambda_.Function:
        return lambda_.Function(
            self,
            construct_id,
            runtime=lambda_.Runtime.PYTHON_3_14,
            code=code,
            handler=handler,
            timeout=Duration.seconds(30),
            log_group=self._log_group(f"{construct_id}Logs"),
        )

    def _grant_base_pull(self, registry: BaseRegistry) -> None:
        role = self.project.role
        assert role is not None  # codebuild.Project creates one
        if registry.kind is RegistryKind.ECR_PUBLIC:
            # Neither action supports resource-level permissions (Service Authorization Reference: Amazon ECR
            # Public, AWS STS); ECR Public pulls need nothing else.
            role.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=["ecr-public:GetAuthorizationToken", "sts:GetServiceBearerToken"], resources=["*"]
                )
            )
            return
        stack = Stack.of(self)
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
                resources=[
                    stack.format_arn(
                        service="ecr",
                        account=registry.account,
                        region=registry.region,
                        resource="repository",
                        resource_name=registry.repository,
                    )
                ],
            )
        )
