"""Default names from the Interbotix ALOHA 2 stack (see docs/contracts in the README)."""

RIG_FILE = "builtin:aloha2"
OUTPUT_DIR = "~/.ros/realsim"
CAMERAS = ("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist")
ARMS = ("follower_left", "follower_right")
JOINT_NAMES = (
    "waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate",
    "gripper", "left_finger", "right_finger",
)


def image_topic(camera: str) -> str:
    """`/cam_high/camera/color/image_rect_raw` for `cam_high`."""
    return f"/{camera}/camera/color/image_rect_raw"


def info_topic(camera: str) -> str:
    """`/cam_high/camera/color/camera_info` for `cam_high`."""
    return f"/{camera}/camera/color/camera_info"
