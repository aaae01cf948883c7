#include "mil/number_text.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <locale.h>
#if defined(__APPLE__)
#include <xlocale.h>
#endif

namespace orion::mil {

namespace {

// The "C" locale for this thread while in scope: strtod and snprintf then use '.' whatever
// setlocale the host application called.
class CLocaleScope {
public:
    CLocaleScope() : previous_(c_locale() ? uselocale(c_locale()) : nullptr) {}
    ~CLocaleScope() {
        if (previous_) uselocale(previous_);
    }
    CLocaleScope(const CLocaleScope&) = delete;
    CLocaleScope& operator=(const CLocaleScope&) = delete;

private:
    static locale_t c_locale() {
        static const locale_t c = newlocale(LC_ALL_MASK, "C", static_cast<locale_t>(nullptr));
        return c;
    }
    locale_t previous_;
};

bool reads_back(const char* text, double v) { return std::strtod(text, nullptr) == v; }

// `%.{digits-1}e` of v, or (when that does not read back) the decimal one unit away in the last
// digit that does: the shortest round-trip digits are not always the correctly rounded ones at a
// power of two, where the gap below a double is half the gap above.
bool scientific_with(double v, int digits, std::string& out) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*e", digits - 1, v);
    if (reads_back(buf, v)) {
        out = buf;
        return true;
    }
    std::string s = buf;
    const size_t e = s.find('e');
    for (int step : {+1, -1}) {
        std::string t = s;
        size_t i = e;  // walk the mantissa digits from the last, carrying
        bool carried = true;
        while (carried && i-- > 0) {
            char& c = t[i];
            if (c < '0' || c > '9') continue;
            if (step > 0) {
                carried = c == '9';
                c = carried ? '0' : static_cast<char>(c + 1);
            } else {
                carried = c == '0';
                c = carried ? '9' : static_cast<char>(c - 1);
            }
        }
        if (carried || t[t[0] == '-' ? 1 : 0] == '0') continue;  // would change the exponent: not a neighbour
        if (reads_back(t.c_str(), v)) {
            out = t;
            return true;
        }
    }
    return false;
}

}  // namespace

std::optional<double> parse_double(std::string_view text, bool hex) {
    if (text.empty() || !((text[0] >= '0' && text[0] <= '9') || text[0] == '.')) return std::nullopt;
    const std::string s = (hex ? "0x" : "") + std::string(text);
    CLocaleScope c;
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (end != s.c_str() + s.size()) return std::nullopt;
    if (errno == ERANGE && std::isinf(v)) return std::nullopt;
    return v;
}

std::string format_shortest(double v, bool fixed) {
    CLocaleScope c;
    std::string sci;
    for (int digits = 1; digits <= 17; ++digits)
        if (scientific_with(v, digits, sci)) break;
    // sci is [-]d[.ddd]e[+-]XX: split into sign, significant digits and decimal exponent
    const bool negative = sci[0] == '-';
    const size_t e = sci.find('e');
    std::string digits;
    for (size_t i = negative ? 1 : 0; i < e; ++i)
        if (sci[i] != '.') digits += sci[i];
    int exponent = std::atoi(sci.c_str() + e + 1);
    while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
    std::string out = negative ? "-" : "";
    if (!fixed) {
        out += digits.substr(0, 1);
        if (digits.size() > 1) out += "." + digits.substr(1);
        char exp[16];
        std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', exponent < 0 ? -exponent : exponent);
        return out + exp;
    }
    const int n = static_cast<int>(digits.size());
    if (exponent >= n - 1) return out + digits + std::string(static_cast<size_t>(exponent - (n - 1)), '0');
    if (exponent >= 0) return out + digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    return out + "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
}

std::string format_general(double v) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
    const double magnitude = std::fabs(v);
    return format_shortest(v, magnitude == 0 || (magnitude >= 1e-5 && magnitude < 1e16));
}

}  // namespace orion::mil
