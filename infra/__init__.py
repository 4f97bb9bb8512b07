"""CDK side of the platform: constructs (logic) and the stage that wires them."""
